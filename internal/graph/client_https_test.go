package graph_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/httpjson"
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
	const token = "sk_0123456789abcdef0123"
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != graph.DocumentPath+"guide/a" || r.Header.Get("Authorization") != "Bearer "+token {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, graph.DocumentJSON{Key: "guide/a", Version: 2})
	}))
	defer srv.Close()
	d, err := (&graph.Client{Addr: srv.URL, HTTP: srv.Client(), Token: token}).Document(ctx, "guide/a")
	if err != nil || d.Key != "guide/a" || d.Version != 2 {
		t.Errorf("document over https: %+v, %v", d, err)
	}

	for _, addr := range []string{"10.0.0.5:9104", "http://projector-graph:9104"} {
		rt := &recordingTransport{}
		_, err := (&graph.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token}).Document(ctx, "guide/a")
		if !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "-insecure-plain-http") || len(rt.urls) != 0 {
			t.Errorf("%s: %v, %d requests; want the token refused before any request", addr, err, len(rt.urls))
		}
		if _, err := (&graph.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token, InsecurePlainHTTP: true}).Document(ctx, "guide/a"); err != nil || len(rt.urls) != 1 {
			t.Errorf("%s with InsecurePlainHTTP: %v, requests %v", addr, err, rt.urls)
		}
	}
}
