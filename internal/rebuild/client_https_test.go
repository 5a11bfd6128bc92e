package rebuild_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/rebuild"
)

// The client speaks HTTPS to an https:// address, and refuses to send its
// token over plain HTTP beyond loopback without making the request,
// unless told that the network is trusted.
func TestClientHTTPSAndPlainHTTP(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != rebuild.AdminPath || r.Header.Get("Authorization") != "Bearer "+authtest.Token {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, rebuild.Status{Projector: "index", Phase: rebuild.PhaseIdle})
	}))
	defer srv.Close()
	st, err := (&rebuild.Client{Addr: srv.URL, HTTP: srv.Client(), Token: authtest.Token}).Status(ctx)
	if err != nil || st.Projector != "index" {
		t.Errorf("status over https: %+v, %v", st, err)
	}

	authtest.CheckPlainHTTPRefused(t, func(addr string, hc *http.Client, insecure bool) error {
		_, err := (&rebuild.Client{Addr: addr, HTTP: hc, Token: authtest.Token, InsecurePlainHTTP: insecure}).Status(ctx)
		return err
	})
}
