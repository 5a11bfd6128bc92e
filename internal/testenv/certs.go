package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certificates are a certificate authority made for one test run and a
// server key pair it signed, valid for 127.0.0.1 and localhost: what every
// TLS listener of a test serves, and what every client of it trusts. They
// are made anew each time and never leave the machine.
type Certificates struct {
	Dir      string // the folder of the files below
	CAFile   string // the CA's certificate (PEM): what clients trust
	CertFile string // the server's certificate (PEM), signed by the CA
	KeyFile  string // the server's private key (PEM, PKCS #8), mode 0600
	// KeyPEM is KeyFile's content: a secret of the run, which no output
	// may hold.
	KeyPEM []byte
	// Pool holds the CA alone.
	Pool *x509.CertPool
}

// File names of WriteCertificates.
const (
	CAFileName   = "ca.crt"
	CertFileName = "server.crt"
	KeyFileName  = "server.key"
)

// NewCertificates makes Certificates in a temporary folder of t.
func NewCertificates(t testing.TB) Certificates {
	t.Helper()
	c, err := WriteCertificates(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return c
}

// WriteCertificates makes a CA and a server key pair for 127.0.0.1 and
// localhost, and writes them into dir (created if missing) as
// [CAFileName], [CertFileName] and [KeyFileName]. The CA's own key is
// never written: nothing else can be signed with it.
func WriteCertificates(dir string) (Certificates, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Certificates{}, fmt.Errorf("certificates: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: %w", err)
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "converge test CA"},
		NotBefore:             now.Add(-time.Hour), // a clock a little behind still accepts it
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: %w", err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client auth too: a server that is also a client of another
		// (none in the tests yet) can present the same pair.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: server: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Certificates{}, fmt.Errorf("certificates: %w", err)
	}
	c := Certificates{
		Dir:      dir,
		CAFile:   filepath.Join(dir, CAFileName),
		CertFile: filepath.Join(dir, CertFileName),
		KeyFile:  filepath.Join(dir, KeyFileName),
		KeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Pool:     x509.NewCertPool(),
	}
	c.Pool.AddCert(ca)
	for path, data := range map[string][]byte{
		c.CAFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		c.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		c.KeyFile:  c.KeyPEM,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return Certificates{}, fmt.Errorf("certificates: %w", err)
		}
	}
	// Certificates are public: readable by a server running as another
	// user (Postgres as "postgres" under root).
	for _, path := range []string{c.CAFile, c.CertFile} {
		if err := os.Chmod(path, 0o644); err != nil {
			return Certificates{}, fmt.Errorf("certificates: %w", err)
		}
	}
	return c, nil
}

// ClientTLS is a client configuration that trusts the CA alone.
func (c Certificates) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: c.Pool, MinVersion: tls.VersionTLS12}
}

// ServerTLS is a server configuration serving the key pair.
func (c Certificates) ServerTLS() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
