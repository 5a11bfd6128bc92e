package auth

import (
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/telemetry"
)

// EnvInsecureNoAuth is the variable of -insecure-no-auth.
const EnvInsecureNoAuth = "CONVERGE_INSECURE_NO_AUTH"

// Settings are how a service secures its HTTP listeners: the tokens its
// API accepts, its TLS key pair, whether it may serve beyond loopback
// without tokens, and whether it may accept tokens there over plain HTTP.
type Settings struct {
	TokensFile        string // empty: authentication off
	TLSCert           string // with TLSKey; both empty: plain HTTP
	TLSKey            string
	InsecureNoAuth    bool
	InsecurePlainHTTP bool
}

// BindFlags binds -tokens-file, -tls-cert, -tls-key, -insecure-no-auth
// and -insecure-plain-http to their environment variables; call the
// returned function after parsing.
func BindFlags(f *config.Flags) func() Settings {
	tokens := f.String("tokens-file", EnvTokensFile, "", "bearer tokens the API accepts, one a line: name scopes token (empty: no authentication, loopback only)")
	cert := f.String("tls-cert", telemetry.EnvTLSCert, "", "PEM certificate (chain) of the HTTP listeners (empty: plain HTTP, which refuses tokens beyond loopback)")
	key := f.String("tls-key", telemetry.EnvTLSKey, "", "PEM private key of -tls-cert")
	insecure := f.Bool(InsecureNoAuthFlag, EnvInsecureNoAuth, false, "serve the API beyond loopback without a tokens file")
	plain := f.Bool(InsecurePlainHTTPFlag, EnvInsecurePlainHTTP, false, "accept bearer tokens over plain HTTP beyond loopback (a trusted network), without -tls-cert")
	return func() Settings {
		return Settings{TokensFile: *tokens, TLSCert: *cert, TLSKey: *key, InsecureNoAuth: *insecure, InsecurePlainHTTP: *plain}
	}
}

// CheckListen decides whether a service with these settings may serve its
// API on addr with tokens (loaded by [Settings.Tokens]): [CheckListen],
// then [CheckPlainHTTP].
func (s Settings) CheckListen(addr string, tokens *Tokens) error {
	if err := CheckListen(addr, tokens, s.InsecureNoAuth); err != nil {
		return err
	}
	return CheckPlainHTTP(addr, tokens, s.TLS().Enabled(), s.InsecurePlainHTTP)
}

// BindTLSFlags binds -tls-cert and -tls-key alone, for a service that
// serves no API beyond /metrics, /healthz and /readyz (the relay): it takes
// no tokens, so it offers no flag that would seem to protect it.
func BindTLSFlags(f *config.Flags) func() telemetry.TLSFiles {
	cert := f.String("tls-cert", telemetry.EnvTLSCert, "", "PEM certificate (chain) of the metrics listener (empty: plain HTTP)")
	key := f.String("tls-key", telemetry.EnvTLSKey, "", "PEM private key of -tls-cert")
	return func() telemetry.TLSFiles { return telemetry.TLSFiles{Cert: *cert, Key: *key} }
}

// TLS is the settings' key pair.
func (s Settings) TLS() telemetry.TLSFiles { return telemetry.TLSFiles{Cert: s.TLSCert, Key: s.TLSKey} }

// Validate reports settings that cannot work without reading any file.
func (s Settings) Validate() error { return s.TLS().Validate() }

// Tokens loads the tokens file; nil, nil without one.
func (s Settings) Tokens() (*Tokens, error) {
	if s.TokensFile == "" {
		return nil, nil
	}
	return Load(s.TokensFile)
}
