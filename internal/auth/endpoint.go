package auth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/telemetry"
)

// EnvTLSCA is the variable of -tls-ca.
const EnvTLSCA = "CONVERGE_TLS_CA"

// BaseURL is the base URL of a service's API given as addr: host:port,
// which is plain HTTP (http://host:port) as it always was, or an http://
// or https:// URL, whose path, if any, prefixes every request's.
func BaseURL(addr string) (*url.URL, error) {
	addr = strings.TrimSpace(addr)
	if !strings.Contains(addr, "://") {
		// A bare host:port; parsed as a URL, "localhost:9103" would be a
		// scheme and an opaque rest.
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	switch {
	case err != nil:
		return nil, fmt.Errorf("auth: address %q: %w", addr, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("auth: address %q: want host:port, http://host:port or https://host:port", addr)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("auth: address %q names no host", addr)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("auth: address %q: want scheme://host:port[/path], without user, query or fragment", addr)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// Endpoint is a service's API as a client calls it: where, and the token
// it sends there.
type Endpoint struct {
	Addr  string // host:port (plain HTTP), or an http:// or https:// URL
	Token string // the bearer token; empty: none
	// InsecurePlainHTTP lets Token go over plain HTTP beyond loopback
	// (see [CheckSend]).
	InsecurePlainHTTP bool
}

// URL is the URL of path with query at the endpoint; an error when Addr is
// no address, or when Token must not be sent there ([CheckSend]), so that
// a request that would leak it is never made.
func (e Endpoint) URL(path string, query url.Values) (string, error) {
	u, err := BaseURL(e.Addr)
	if err != nil {
		return "", err
	}
	if err := CheckSend(u, e.Token, e.InsecurePlainHTTP); err != nil {
		return "", err
	}
	u.Path += path
	u.RawQuery = query.Encode()
	return u.String(), nil
}

// ClientSettings are how the converge CLI reaches the services' APIs over
// HTTPS and plain HTTP; the token itself comes from [TokenFromEnv].
type ClientSettings struct {
	// CAFile is a PEM file of the CA certificates that the services'
	// certificates chain to; empty: the system's roots.
	CAFile string
	// InsecurePlainHTTP lets the token go over plain HTTP beyond loopback.
	InsecurePlainHTTP bool
}

// BindClientFlags binds -tls-ca and -insecure-plain-http to their
// environment variables; call the returned function after parsing.
func BindClientFlags(f *config.Flags) func() ClientSettings {
	ca := f.String("tls-ca", EnvTLSCA, "", "PEM file of the CA certificates of the services' https:// addresses (empty: the system's roots)")
	plain := f.Bool(InsecurePlainHTTPFlag, EnvInsecurePlainHTTP, false, "send the token over plain http:// beyond loopback (a trusted network)")
	return func() ClientSettings { return ClientSettings{CAFile: *ca, InsecurePlainHTTP: *plain} }
}

// TLSConfig is the client TLS configuration trusting CAFile's
// certificates alone, or nil (the system's roots) without one.
func (s ClientSettings) TLSConfig() (*tls.Config, error) {
	if s.CAFile == "" {
		return nil, nil
	}
	cfg, err := telemetry.TrustCAFile(s.CAFile)
	if err != nil {
		return nil, fmt.Errorf("auth: -tls-ca (%s): %w", EnvTLSCA, err)
	}
	return cfg, nil
}

// HTTPClient is an HTTP client with the timeout that trusts CAFile's
// certificates (the system's roots without one).
func (s ClientSettings) HTTPClient(timeout time.Duration) (*http.Client, error) {
	cfg, err := s.TLSConfig()
	if err != nil {
		return nil, err
	}
	base, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return nil, errors.New("auth: http.DefaultTransport is not an *http.Transport")
	}
	t := base.Clone()
	if cfg != nil {
		t.TLSClientConfig = cfg
	}
	return &http.Client{Timeout: timeout, Transport: t}, nil
}

// Endpoint is the endpoint at addr, sending token, under these settings.
func (s ClientSettings) Endpoint(addr, token string) Endpoint {
	return Endpoint{Addr: addr, Token: token, InsecurePlainHTTP: s.InsecurePlainHTTP}
}
