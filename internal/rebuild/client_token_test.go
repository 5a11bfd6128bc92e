package rebuild_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/rebuild"
)

// The client sends its token on both its requests, and a refusal is an
// APIError with the guard's status and code.
func TestClientSendsItsToken(t *testing.T) {
	tokens := authtest.Tokens(t, "ops admin sk_admin_0123456789abcd\ncli read sk_read_0123456789abcdef\n")
	g := auth.NewGuard(tokens, nil, nil)
	answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusAccepted, rebuild.Status{ID: "r1"})
	})
	mux := http.NewServeMux()
	mux.Handle("GET "+rebuild.AdminPath, g.Require(auth.Admin, answer))
	mux.Handle("POST "+rebuild.AdminPath, g.Require(auth.Admin, answer))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	for _, tc := range []struct {
		token  string
		status int
		code   string
	}{{"sk_admin_0123456789abcd", 200, ""}, {"", 401, "unauthorized"}, {"sk_read_0123456789abcdef", 403, "forbidden"}} {
		c := &rebuild.Client{Addr: addr, Token: tc.token}
		_, started, startErr := c.Start(ctx)
		_, statusErr := c.Status(ctx)
		for what, err := range map[string]error{"start": startErr, "status": statusErr} {
			var apiErr *rebuild.APIError
			switch {
			case tc.status == 200 && err != nil:
				t.Errorf("%s with token %q: %v", what, tc.token, err)
			case tc.status != 200 && (!errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Code != tc.code):
				t.Errorf("%s with token %q: %v, want %d %s", what, tc.token, err, tc.status, tc.code)
			}
		}
		if tc.status == 200 && !started {
			t.Error("a 202 is not reported as started")
		}
	}
}
