package telemetry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// The variables of -tls-cert and -tls-key.
const (
	EnvTLSCert = "CONVERGE_TLS_CERT"
	EnvTLSKey  = "CONVERGE_TLS_KEY" //nolint:gosec // the name of a variable, not a credential
)

// TLSFiles name a PEM certificate (chain) and its private key; both empty
// is plain HTTP.
type TLSFiles struct {
	Cert string
	Key  string
}

// Enabled reports whether a key pair is named.
func (f TLSFiles) Enabled() bool { return f.Cert != "" || f.Key != "" }

// Validate reports a certificate without its key, or a key without its
// certificate.
func (f TLSFiles) Validate() error {
	if (f.Cert == "") != (f.Key == "") {
		return fmt.Errorf("telemetry: TLS needs both -tls-cert (%s) and -tls-key (%s)", EnvTLSCert, EnvTLSKey)
	}
	return nil
}

// Config returns a server TLS configuration serving the key pair, or nil
// when none is named. The pair is loaded now, so that a bad one stops the
// service at its start, and again on the first handshake after either
// file changes, so that a renewed certificate is served without a
// restart; a pair that then fails to load (one file rewritten, not yet
// the other) leaves the previous one in use.
func (f TLSFiles) Config() (*tls.Config, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, nil
	}
	kp := &keyPair{files: f}
	if err := kp.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.certificate(), nil
		},
	}, nil
}

// keyPair is the certificate in use and the state of its files when it was
// loaded.
type keyPair struct {
	files TLSFiles
	mu    sync.Mutex
	cert  *tls.Certificate
	stamp [2]fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stamps(f TLSFiles) ([2]fileStamp, error) {
	var s [2]fileStamp
	for i, path := range []string{f.Cert, f.Key} {
		fi, err := os.Stat(path)
		if err != nil {
			return s, err
		}
		s[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return s, nil
}

// load loads the pair; the caller holds mu, or kp is not yet shared.
func (kp *keyPair) load() error {
	st, err := stamps(kp.files)
	if err != nil {
		return fmt.Errorf("telemetry: TLS key pair: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(kp.files.Cert, kp.files.Key)
	if err != nil {
		return fmt.Errorf("telemetry: TLS key pair %s, %s: %w", kp.files.Cert, kp.files.Key, err)
	}
	if len(cert.Certificate) == 0 {
		return errors.New("telemetry: TLS key pair: no certificate")
	}
	kp.cert, kp.stamp = &cert, st
	return nil
}

// certificate returns the pair in use, loading it again first when its
// files changed.
func (kp *keyPair) certificate() *tls.Certificate {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if st, err := stamps(kp.files); err == nil && st != kp.stamp {
		_ = kp.load() // on failure the previous pair stays, tried again next time
	}
	return kp.cert
}

// TrustCAFile is a client TLS configuration trusting the CA certificates
// of the PEM file alone; an error names a file that cannot be read or holds
// no certificate. The flags that name such a file (-tls-ca, -qdrant-ca,
// -neo4j-ca) wrap its error with their own name.
func TrustCAFile(file string) (*tls.Config, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}
