package auth_test

import (
	"crypto/tls"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
)

func TestBaseURL(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:9103", "http://127.0.0.1:9103"},
		{"localhost:9103", "http://localhost:9103"},
		{"[::1]:9103", "http://[::1]:9103"},
		{" projector-index:9103 ", "http://projector-index:9103"},
		{"http://10.0.0.5:9103", "http://10.0.0.5:9103"},
		{"https://index.example:9103", "https://index.example:9103"},
		{"https://index.example:9103/", "https://index.example:9103"},
		{"https://gateway.example/converge/index/", "https://gateway.example/converge/index"},
	} {
		u, err := auth.BaseURL(tc.addr)
		if err != nil || u.String() != tc.want {
			t.Errorf("BaseURL(%q) = %v, %v; want %s", tc.addr, u, err, tc.want)
		}
	}
	for _, addr := range []string{"", ":9103", "ftp://x:21", "https://", "https://user:pw@x:1", "https://x:1/?q=1", "https://x:1/#f", "http://[::1"} {
		if u, err := auth.BaseURL(addr); err == nil {
			t.Errorf("BaseURL(%q) = %v, want an error", addr, u)
		}
	}
}

func TestEndpointURL(t *testing.T) {
	const secret = "sk_0123456789abcdef0123"
	for _, tc := range []struct {
		ep   auth.Endpoint
		want string // "" when refused
	}{
		{auth.Endpoint{Addr: "127.0.0.1:9103", Token: secret}, "http://127.0.0.1:9103/v1/graph/a%20b/c?k=3"},
		{auth.Endpoint{Addr: "https://gw.example/index", Token: secret}, "https://gw.example/index/v1/graph/a%20b/c?k=3"},
		{auth.Endpoint{Addr: "10.0.0.5:9103"}, "http://10.0.0.5:9103/v1/graph/a%20b/c?k=3"},
		{auth.Endpoint{Addr: "10.0.0.5:9103", Token: secret}, ""},
		{auth.Endpoint{Addr: "http://10.0.0.5:9103", Token: secret}, ""},
		{auth.Endpoint{Addr: "http://10.0.0.5:9103", Token: secret, InsecurePlainHTTP: true}, "http://10.0.0.5:9103/v1/graph/a%20b/c?k=3"},
		{auth.Endpoint{Addr: "ftp://10.0.0.5:21"}, ""},
	} {
		got, err := tc.ep.URL("/v1/graph/a b/c", url.Values{"k": {"3"}})
		if tc.want == "" {
			if err == nil {
				t.Errorf("%+v: %s, want a refusal", tc.ep, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: %s, %v; want %s", tc.ep, got, err, tc.want)
		}
	}
}

// caOf writes the certificate of srv, its own CA, as a PEM file.
func caOf(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The client of ClientSettings trusts -tls-ca's certificates: a server
// whose certificate chains to them is reached, and without them the
// certificate is refused.
func TestClientSettingsTrustTheCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer srv.Close()

	hc, err := auth.ClientSettings{CAFile: caOf(t, srv)}.HTTPClient(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatalf("with -tls-ca: %v", err)
	}
	_ = resp.Body.Close()
	if hc.Timeout != 10*time.Second {
		t.Errorf("timeout %v", hc.Timeout)
	}

	hc, err = auth.ClientSettings{}.HTTPClient(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var untrusted *tls.CertificateVerificationError
	if resp, err := hc.Get(srv.URL); !errors.As(err, &untrusted) {
		if err == nil {
			_ = resp.Body.Close()
		}
		t.Fatalf("without -tls-ca: %v, want the certificate refused", err)
	}

	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{empty, filepath.Join(t.TempDir(), "missing.pem")} {
		if _, err := (auth.ClientSettings{CAFile: path}).HTTPClient(time.Second); err == nil || !strings.Contains(err.Error(), "-tls-ca") {
			t.Errorf("CA file %s: %v, want an error naming -tls-ca", path, err)
		}
	}
}

func TestBindClientFlags(t *testing.T) {
	t.Setenv(auth.EnvTLSCA, "/etc/converge/ca.pem")
	t.Setenv(auth.EnvInsecurePlainHTTP, "1")
	f := config.NewFlags("converge search")
	settings := auth.BindClientFlags(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if s := settings(); s != (auth.ClientSettings{CAFile: "/etc/converge/ca.pem", InsecurePlainHTTP: true}) {
		t.Fatalf("settings %+v", s)
	}
	f = config.NewFlags("converge search")
	settings = auth.BindClientFlags(f)
	if err := f.Parse([]string{"-tls-ca", "other.pem", "-insecure-plain-http=false"}); err != nil {
		t.Fatal(err)
	}
	if s := settings(); s != (auth.ClientSettings{CAFile: "other.pem"}) {
		t.Fatalf("flags over the environment: %+v", s)
	}
	if ep := settings().Endpoint("10.0.0.5:9103", "t"); ep != (auth.Endpoint{Addr: "10.0.0.5:9103", Token: "t"}) {
		t.Fatalf("endpoint %+v", ep)
	}
}
