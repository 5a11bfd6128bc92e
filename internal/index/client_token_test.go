package index_test

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
	"github.com/converge-sync/converge/internal/index"
)

// The client sends its token, and a refusal is an APIError with the
// guard's status and code.
func TestClientSendsItsToken(t *testing.T) {
	tokens := authtest.Tokens(t, "cli read sk_read_0123456789abcdef\nwriter write sk_write_0123456789abcd\n")
	mux := http.NewServeMux()
	mux.Handle("GET "+index.SearchPath, auth.NewGuard(tokens, nil, nil).Require(auth.Read, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, index.SearchResponse{Results: []index.SearchResult{}})
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		token  string
		status int
		code   string
	}{{"sk_read_0123456789abcdef", 200, ""}, {"", 401, "unauthorized"}, {"sk_write_0123456789abcd", 403, "forbidden"}} {
		_, err := (&index.Client{Addr: addr, Token: tc.token}).Search(context.Background(), "water", 1)
		var apiErr *index.APIError
		switch {
		case tc.status == 200 && err != nil:
			t.Errorf("token %q: %v", tc.token, err)
		case tc.status != 200 && (!errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Code != tc.code):
			t.Errorf("token %q: %v, want %d %s", tc.token, err, tc.status, tc.code)
		}
	}
}
