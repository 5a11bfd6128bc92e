package writer_test

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
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

const (
	writeToken = "sk_write_0123456789abcdef"
	adminToken = "sk_admin_0123456789abcdef"
	readToken  = "sk_read_0123456789abcdefg"
	newToken   = "sk_new_0123456789abcdefgh"
)

const tokensText = "# the writer's clients\n" +
	"producer write " + writeToken + "\n" +
	"ops admin " + adminToken + "\n" +
	"reader read " + readToken + "\n"

func writeTokens(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// authed sends a request with the bearer token (none when empty).
func authed(t *testing.T, c *http.Client, method, u, token, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	auth.SetBearer(req.Header, token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The document routes need the write scope (reading one, read or write),
// re-emission the admin scope; what is refused writes nothing.
func TestAPIRequiresTokens(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, tokensText)
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	metrics := writer.NewMetrics(reg)
	api := writer.NewAPI(e.store, writer.APIConfig{BatchSize: 10, Guard: auth.NewGuard(tokens, reg, nil)}, metrics, nil)
	srv := httptest.NewServer(api)
	defer srv.Close()
	c := srv.Client()
	doc := srv.URL + "/v1/documents/guarded"
	const body = `{"version":1,"title":"T","body":"text"}`

	for _, tc := range []struct {
		name, method, url, token, contentType, body string
		status                                      int
	}{
		{"put without a token", "PUT", doc, "", "application/json", body, 401},
		{"put with an unknown token", "PUT", doc, "sk_nobody_0123456789abc", "application/json", body, 401},
		{"put with the read scope", "PUT", doc, readToken, "application/json", body, 403},
		{"put with the admin scope", "PUT", doc, adminToken, "application/json", body, 403},
		{"batch with the read scope", "POST", srv.URL + "/v1/documents:batch", readToken, "application/x-ndjson", `{"key":"guarded","version":1,"body":"b"}`, 403},
		{"delete without a token", "DELETE", doc + "?version=2", "", "", "", 401},
		{"get before any write", "GET", doc, readToken, "", "", 404},
		{"put with the write scope", "PUT", doc, writeToken, "application/json", body, 200},
		{"get with the read scope", "GET", doc, readToken, "", "", 200},
		{"get with the write scope", "GET", doc, writeToken, "", "", 200},
		{"get with the admin scope alone", "GET", doc, adminToken, "", "", 403},
		{"get without a token", "GET", doc, "", "", "", 401},
		{"batch with the write scope", "POST", srv.URL + "/v1/documents:batch", writeToken, "application/x-ndjson", `{"key":"guarded-2","version":1,"body":"b"}`, 200},
		{"delete with the write scope", "DELETE", doc + "?version=2", writeToken, "", "", 200},
		{"re-emit with the write scope", "POST", srv.URL + writer.ReemitPath, writeToken, "application/json", `{"keys":["guarded"]}`, 403},
		{"re-emit without a token", "POST", srv.URL + writer.ReemitPath, "", "application/json", `{"keys":["guarded"]}`, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, b := authed(t, c, tc.method, tc.url, tc.token, tc.contentType, tc.body); code != tc.status {
				t.Fatalf("%d %s, want %d", code, b, tc.status)
			}
		})
	}

	// The client sends its token: admin re-emits, write is refused.
	wc, err := writer.NewClient(srv.URL, c)
	if err != nil {
		t.Fatal(err)
	}
	wc.Token = writeToken
	var apiErr *writer.APIError
	if _, err := wc.ReemitKeys(context.Background(), []string{"guarded-2"}); !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Code != "forbidden" {
		t.Fatalf("re-emission with the write scope: %v", err)
	}
	wc.Token = adminToken
	if res, err := wc.ReemitKeys(context.Background(), []string{"guarded-2"}); err != nil || len(res.Reemitted) != 1 {
		t.Fatalf("re-emission with the admin scope: %+v, %v", res, err)
	}

	// Refusals are counted with their status among the requests, and by
	// reason among the refusals.
	m := scrape(t, reg)
	if v, err := m.Value("converge_writer_requests_total", telemetry.Labels{"route": "put", "code": "401"}); err != nil || v != 2 {
		t.Errorf("put 401s counted %v, %v; want 2", v, err)
	}
	if v, err := m.Value("converge_auth_refusals_total", telemetry.Labels{"reason": auth.ReasonScope, "route": "POST " + writer.ReemitPath}); err != nil || v != 2 {
		t.Errorf("re-emission refusals for scope %v, %v; want 2", v, err)
	}
}

// scrape reads reg back as /metrics serves it.
func scrape(t *testing.T, reg *prometheus.Registry) telemetry.Metrics {
	t.Helper()
	rec := httptest.NewRecorder()
	telemetry.Handler(reg).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m, err := telemetry.Parse(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Without tokens the writer listens on loopback only, unless told to
// accept unauthenticated requests from the network; a TLS certificate
// needs its key. All of it is refused before the database is touched.
func TestRunRefusesAnInsecureListener(t *testing.T) {
	deps := service.Deps{Log: discardLogger(), Registry: telemetry.NewRegistry()}
	for _, tc := range []struct {
		name string
		cfg  writer.ServiceConfig
		want string
	}{
		{"every interface without tokens", writer.ServiceConfig{HTTPAddr: "0.0.0.0:0"}, "-insecure-no-auth"},
		{"a host name without tokens", writer.ServiceConfig{HTTPAddr: "writer.example:8080"}, "writer.example:8080"},
		{"a missing tokens file", writer.ServiceConfig{HTTPAddr: "127.0.0.1:0", TokensFile: filepath.Join(t.TempDir(), "none")}, "no such file"},
		{"a certificate without its key", writer.ServiceConfig{HTTPAddr: "127.0.0.1:0", TLSCert: "cert.pem"}, "-tls-key"},
		{"told to accept them", writer.ServiceConfig{HTTPAddr: "0.0.0.0:0", InsecureNoAuth: true}, "no Postgres pool"},
		{"on loopback", writer.ServiceConfig{HTTPAddr: "127.0.0.1:0"}, "no Postgres pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.PostgresURL = "postgres://unused"
			err := writer.Run(context.Background(), tc.cfg, deps)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestFlagsBindAuthAndTLS(t *testing.T) {
	t.Setenv(auth.EnvTokensFile, "/etc/converge/tokens")
	f := config.NewFlags("writer")
	parse := writer.Flags(f)
	if err := f.Parse([]string{"-postgres-url", "postgres://x", "-tls-cert", "c.pem", "-tls-key", "k.pem", "-insecure-no-auth"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TokensFile != "/etc/converge/tokens" || cfg.TLSCert != "c.pem" || cfg.TLSKey != "k.pem" || !cfg.InsecureNoAuth {
		t.Fatalf("config %+v", cfg)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir.
func selfSigned(t *testing.T, dir string) (certPath, keyPath string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "writer"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, cert
}

// The writer as deployed beyond loopback: tokens and TLS on every
// address, a new tokens file in force after SIGHUP, and no token in its
// log or its metrics.
func TestRunWithTokensAndTLS(t *testing.T) {
	// SIGHUP's default action ends the process: caught here from the start
	// to the end of the test binary, whether or not the writer's watch is
	// registered yet.
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGHUP)

	dir := t.TempDir()
	tokensPath := filepath.Join(dir, "tokens")
	writeTokens(t, tokensPath, tokensText)
	certPath, keyPath, cert := selfSigned(t, dir)
	pool, err := pgxpool.New(context.Background(), pg.MigratedDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs testenv.Buffer
	reg := telemetry.NewRegistry()
	deps := service.Deps{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Registry: reg, Postgres: pool}
	metricsAddr := freeAddr(t)
	cfg := writer.ServiceConfig{PostgresURL: "unused: the pool is given", HTTPAddr: "127.0.0.1:0", MetricsAddr: metricsAddr,
		TokensFile: tokensPath, TLSCert: certPath, TLSKey: keyPath, ShutdownGrace: 5 * time.Second}
	base := "https://" + startService(t, cfg, deps)

	roots := x509.NewCertPool()
	roots.AddCert(cert)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer c.CloseIdleConnections()
	doc := base + "/v1/documents/tls-doc"
	if code, b := authed(t, c, "PUT", doc, writeToken, "application/json", `{"version":1,"body":"b"}`); code != 200 {
		t.Fatalf("PUT with the write scope over TLS: %d %s", code, b)
	}
	if code, _ := authed(t, c, "PUT", doc, "", "application/json", `{"version":2,"body":"b"}`); code != 401 {
		t.Fatalf("PUT without a token: %d", code)
	}
	if code, _ := authed(t, c, "PUT", doc, newToken, "application/json", `{"version":2,"body":"b"}`); code != 401 {
		t.Fatalf("PUT with a token not yet in the file: %d", code)
	}
	// Plain HTTP is not served.
	if resp, err := http.Get("http://" + strings.TrimPrefix(base, "https://") + "/v1/documents/tls-doc"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served the API")
		}
	}
	// The operational endpoints stay open, over TLS too.
	testenv.Eventually(t, "readyz over TLS", waitTimeout, func() bool {
		code, _ := authed(t, c, "GET", "https://"+metricsAddr+"/readyz", "", "", "")
		return code == 200
	})

	// A new file after SIGHUP: the new token in, the removed one out.
	writeTokens(t, tokensPath, "producer write "+newToken+"\n")
	deadline := time.Now().Add(waitTimeout)
	for {
		code, _ := authed(t, c, "GET", doc, newToken, "", "")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new tokens file is not in force after SIGHUP (%d); log:\n%s", code, logs.String())
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _ := authed(t, c, "PUT", doc, writeToken, "application/json", `{"version":2,"body":"b"}`); code != 401 {
		t.Fatalf("a token removed from the file: %d", code)
	}

	_, metrics := authed(t, c, "GET", "https://"+metricsAddr+"/metrics", "", "", "")
	if !strings.Contains(metrics, "converge_auth_refusals_total") {
		t.Fatal("no refusals in /metrics")
	}
	for what, text := range map[string]string{"log": logs.String(), "/metrics": metrics} {
		for _, tok := range []string{writeToken, adminToken, readToken, newToken} {
			if strings.Contains(text, tok) {
				t.Errorf("the %s shows a token", what)
			}
		}
	}
	if !strings.Contains(logs.String(), "tokens file reloaded") {
		t.Errorf("the reload is not logged:\n%s", logs.String())
	}
}

// startService runs the writer service with cfg and deps until the test
// ends (failing it if Run fails), and returns the address its API listens
// on.
func startService(t *testing.T, cfg writer.ServiceConfig, deps service.Deps) string {
	t.Helper()
	listening := make(chan net.Addr, 1)
	cfg.OnListen = func(a net.Addr) { listening <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- writer.Run(ctx, cfg, deps) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("writer: %v", err)
		}
	})
	select {
	case a := <-listening:
		return a.String()
	case err := <-done:
		t.Fatalf("the writer stopped: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("the writer did not listen")
	}
	return ""
}
