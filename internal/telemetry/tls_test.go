package telemetry_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/telemetry"
)

// selfSigned writes a certificate for 127.0.0.1 named cn, and its key, to
// dir, and returns their paths and the certificate.
func selfSigned(t *testing.T, dir, cn string) (certPath, keyPath string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	// Written beside and renamed, as a certificate manager does, so that a
	// handshake never reads half a file.
	for path, block := range map[string]*pem.Block{certPath: {Type: "CERTIFICATE", Bytes: der}, keyPath: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(path+".new", pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	return certPath, keyPath, cert
}

func TestServeOverTLS(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, first := selfSigned(t, dir, "first")
	cfg, err := telemetry.TLSFiles{Cert: certPath, Key: keyPath}.Config()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- telemetry.ServeListener(ctx, ln, telemetry.Handler(telemetry.NewRegistry()), 5*time.Second, nil, telemetry.WithTLS(cfg))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base := "https://" + ln.Addr().String()

	// client trusts ca alone; each request is a new connection, with a
	// new handshake.
	client := func(ca *x509.Certificate) *http.Client {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true, ForceAttemptHTTP2: true}}
	}
	get := func(c *http.Client) (*http.Response, string, error) {
		resp, err := c.Get(base + "/healthz")
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}

	resp, body, err := get(client(first))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.Contains(body, "ok") || resp.TLS == nil {
		t.Fatalf("healthz over TLS: %d %q, tls %v", resp.StatusCode, body, resp.TLS != nil)
	}
	if got := resp.TLS.PeerCertificates[0].Subject.CommonName; got != "first" {
		t.Fatalf("served certificate %q, want first", got)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("protocol %s, want HTTP/2 over TLS", resp.Proto)
	}

	// Plain HTTP to the TLS listener is no answer of the API.
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP was served on the TLS listener")
		}
	}

	// A client that trusts another certificate refuses the server's.
	_, _, other := selfSigned(t, t.TempDir(), "other")
	if _, _, err := get(client(other)); err == nil {
		t.Fatal("a client trusting another certificate was answered")
	} else if !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Fatalf("untrusted certificate: %v", err)
	}

	// A renewed pair is served from the next handshake on.
	_, _, second := selfSigned(t, dir, "second")
	resp, _, err = get(client(second))
	if err != nil {
		t.Fatalf("after renewal: %v", err)
	}
	if got := resp.TLS.PeerCertificates[0].Subject.CommonName; got != "second" {
		t.Fatalf("after renewal the server presents %q, want second", got)
	}
}

func TestTLSFilesConfig(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, _ := selfSigned(t, dir, "x")
	_, otherKey, _ := selfSigned(t, t.TempDir(), "y")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := telemetry.TLSFiles{}.Config()
	if cfg != nil || err != nil {
		t.Fatalf("no files: %v, %v; want plain HTTP", cfg, err)
	}
	for _, tc := range []struct {
		name  string
		files telemetry.TLSFiles
		want  string
	}{
		{"cert without key", telemetry.TLSFiles{Cert: certPath}, "-tls-key"},
		{"key without cert", telemetry.TLSFiles{Key: keyPath}, "-tls-cert"},
		{"missing file", telemetry.TLSFiles{Cert: filepath.Join(dir, "nope.pem"), Key: keyPath}, "nope.pem"},
		{"not a certificate", telemetry.TLSFiles{Cert: garbage, Key: keyPath}, "garbage.pem"},
		{"not a key", telemetry.TLSFiles{Cert: certPath, Key: garbage}, "garbage.pem"},
		{"key of another pair", telemetry.TLSFiles{Cert: certPath, Key: otherKey}, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := tc.files.Config()
			if err == nil || cfg != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Config() = %v, %v; want an error naming %s", cfg, err, tc.want)
			}
		})
	}
}
