package graph_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/httpjson"
)

// The client speaks HTTPS to an https:// address, and refuses to send its
// token over plain HTTP beyond loopback without making the request,
// unless told that the network is trusted.
func TestClientHTTPSAndPlainHTTP(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != graph.DocumentPath+"guide/a" || r.Header.Get("Authorization") != "Bearer "+authtest.Token {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, graph.DocumentJSON{Key: "guide/a", Version: 2})
	}))
	defer srv.Close()
	d, err := (&graph.Client{Addr: srv.URL, HTTP: srv.Client(), Token: authtest.Token}).Document(ctx, "guide/a")
	if err != nil || d.Key != "guide/a" || d.Version != 2 {
		t.Errorf("document over https: %+v, %v", d, err)
	}

	authtest.CheckPlainHTTPRefused(t, func(addr string, hc *http.Client, insecure bool) error {
		_, err := (&graph.Client{Addr: addr, HTTP: hc, Token: authtest.Token, InsecurePlainHTTP: insecure}).Document(ctx, "guide/a")
		return err
	})
}
