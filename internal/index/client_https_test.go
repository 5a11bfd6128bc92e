package index_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/index"
)

// The client speaks HTTPS to an https:// address, and refuses to send its
// token over plain HTTP beyond loopback without making the request,
// unless told that the network is trusted.
func TestClientHTTPSAndPlainHTTP(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != index.SearchPath || r.Header.Get("Authorization") != "Bearer "+authtest.Token {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, index.SearchResponse{Results: []index.SearchResult{{Key: "guide/rivers"}}})
	}))
	defer srv.Close()
	res, err := (&index.Client{Addr: srv.URL, HTTP: srv.Client(), Token: authtest.Token}).Search(ctx, "water", 1)
	if err != nil || len(res.Results) != 1 || res.Results[0].Key != "guide/rivers" {
		t.Errorf("search over https: %+v, %v", res, err)
	}

	authtest.CheckPlainHTTPRefused(t, func(addr string, hc *http.Client, insecure bool) error {
		_, err := (&index.Client{Addr: addr, HTTP: hc, Token: authtest.Token, InsecurePlainHTTP: insecure}).Info(ctx)
		return err
	})
}
