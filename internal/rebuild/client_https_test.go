package rebuild_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/rebuild"
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
		if r.URL.Path != rebuild.AdminPath || r.Header.Get("Authorization") != "Bearer "+token {
			http.NotFound(w, r)
			return
		}
		httpjson.Write(w, http.StatusOK, rebuild.Status{Projector: "index", Phase: rebuild.PhaseIdle})
	}))
	defer srv.Close()
	st, err := (&rebuild.Client{Addr: srv.URL, HTTP: srv.Client(), Token: token}).Status(ctx)
	if err != nil || st.Projector != "index" {
		t.Errorf("status over https: %+v, %v", st, err)
	}

	for _, addr := range []string{"10.0.0.5:9103", "http://projector-index:9103"} {
		rt := &recordingTransport{}
		_, _, err := (&rebuild.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token}).Start(ctx)
		if !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "-insecure-plain-http") || len(rt.urls) != 0 {
			t.Errorf("%s: %v, %d requests; want the token refused before any request", addr, err, len(rt.urls))
		}
		if _, err := (&rebuild.Client{Addr: addr, HTTP: &http.Client{Transport: rt}, Token: token, InsecurePlainHTTP: true}).Status(ctx); err != nil || len(rt.urls) != 1 {
			t.Errorf("%s with InsecurePlainHTTP: %v, requests %v", addr, err, rt.urls)
		}
	}
}
