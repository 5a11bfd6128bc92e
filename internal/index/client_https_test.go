package index_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/index"
)

// recordingTransport answers every request 200 {} and records its URL.
type recordingTransport struct{ urls []string }

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.urls = append(rt.urls, r.URL.String())
	rec := httptest.NewRecorder()
	httpjson.Write(rec, http.StatusOK, map[string]any{})
	return rec.Result(), nil
}

// The client speaks HTTPS to an https:// address, and refuses to send its
// token over plain HTTP beyond loopback without making the request,
// unless told that the network is trusted.
func TestClientHTTPSAndPlainHTTP(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != index.SearchPath || r.Header.Get("Authorization") != "Bearer sk_0123456789abcdef0123" {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, index.SearchResponse{Results: []index.SearchResult{{Key: "guide/rivers"}}})
	}))
	defer srv.Close()
	const token = "sk_0123456789abcdef0123"
	res, err := (&index.Client{Addr: srv.URL, HTTP: srv.Client(), Token: token}).Search(ctx, "water", 1)
	if err != nil || len(res.Results) != 1 || res.Results[0].Key != "guide/rivers" {
		t.Errorf("search over https: %+v, %v", res, err)
	}

	for _, addr := range []string{"10.0.0.5:9103", "http://projector-index:9103"} {
		rt := &recordingTransport{}
		_, err := (&index.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token}).Search(ctx, "water", 1)
		if !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "-insecure-plain-http") || len(rt.urls) != 0 {
			t.Errorf("%s: %v, %d requests; want the token refused before any request", addr, err, len(rt.urls))
		}
		if _, err := (&index.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token, InsecurePlainHTTP: true}).Info(ctx); err != nil || len(rt.urls) != 1 {
			t.Errorf("%s with InsecurePlainHTTP: %v, requests %v", addr, err, rt.urls)
		}
	}
}
