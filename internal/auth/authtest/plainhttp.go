package authtest

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
)

// Token is a bearer token for the clients' tests.
const Token = "sk_0123456789abcdef0123"

// recorder answers every request 200 {} and counts them.
type recorder struct{ requests int }

func (r *recorder) RoundTrip(*http.Request) (*http.Response, error) {
	r.requests++
	rec := httptest.NewRecorder()
	httpjson.Write(rec, http.StatusOK, map[string]any{})
	return rec.Result(), nil
}

// CheckPlainHTTPRefused checks a client of a service's API beyond
// loopback over plain HTTP (a bare host:port and an http:// URL): call
// makes one request with Token through hc to addr, trusting the network
// when insecure. Without insecure the token is refused with
// auth.ErrPlainHTTP, naming the flag that allows it, before any request is
// made; with it, the request is made.
func CheckPlainHTTPRefused(t *testing.T, call func(addr string, hc *http.Client, insecure bool) error) {
	t.Helper()
	for _, addr := range []string{"10.0.0.5:9103", "http://projector:9103"} {
		rt := &recorder{}
		hc := &http.Client{Transport: rt}
		if err := call(addr, hc, false); !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "-insecure-plain-http") || rt.requests != 0 {
			t.Errorf("%s: %v, %d requests; want the token refused before any request", addr, err, rt.requests)
		}
		if err := call(addr, hc, true); err != nil || rt.requests != 1 {
			t.Errorf("%s with InsecurePlainHTTP: %v, %d requests; want the one request made", addr, err, rt.requests)
		}
	}
}
