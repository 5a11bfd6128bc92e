package auth

import (
	"net/http"
	"strings"

	"github.com/converge-sync/converge/internal/config"
)

// EnvToken is the variable of the token a client sends (or EnvToken_FILE,
// a file holding it).
const EnvToken = "CONVERGE_TOKEN" //nolint:gosec // the name of a variable, not a credential; also read as _FILE

// TokenFromEnv returns the token in CONVERGE_TOKEN, or in the file named by
// CONVERGE_TOKEN_FILE; "" when neither is set.
func TokenFromEnv() (string, error) {
	v, _, err := config.Lookup(EnvToken)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(v), nil
}

// SetBearer sets h's Authorization to the bearer token, unless token is
// empty.
func SetBearer(h http.Header, token string) {
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
}

// Transport sends Token as a bearer token on each request that has no
// Authorization of its own.
type Transport struct {
	Token string
	// Base defaults to http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if t.Token == "" || req.Header.Get("Authorization") != "" {
		return base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	SetBearer(r.Header, t.Token)
	return base.RoundTrip(r)
}
