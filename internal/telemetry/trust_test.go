package telemetry_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
)

// TrustCAFile trusts the file's CA alone: a server with a certificate of
// that CA is reached, one of another CA (the test server's own) is
// refused; a missing file, one without PEM and a private key (PEM, but no
// certificate) are errors that name the file.
func TestTrustCAFile(t *testing.T) {
	certs := testenv.NewCertificates(t)
	pair, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ours := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ours.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	ours.StartTLS()
	defer ours.Close()
	theirs := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer theirs.Close()

	cfg, err := telemetry.TrustCAFile(certs.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	if resp, err := client.Get(ours.URL); err != nil {
		t.Fatalf("a server of the trusted CA: %v", err)
	} else {
		_ = resp.Body.Close()
	}
	var unknown x509.UnknownAuthorityError
	if _, err := client.Get(theirs.URL); !errors.As(err, &unknown) {
		t.Fatalf("a server of another CA: %v; want its certificate refused", err)
	}

	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, says := range map[string]string{
		filepath.Join(dir, "missing.pem"): "no such file",
		notPEM:                            notPEM + " holds no PEM certificate",
		certs.KeyFile:                     certs.KeyFile + " holds no PEM certificate",
	} {
		if _, err := telemetry.TrustCAFile(file); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("TrustCAFile(%s): %v; want an error saying %q", file, err, says)
		}
	}
}
