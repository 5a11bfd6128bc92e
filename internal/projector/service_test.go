package projector_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
)

// With a tokens file, a projector's read routes need a read token, its
// admin routes an admin token, and /metrics, /healthz and /readyz stay
// open; a token never reaches the log.
func TestRunServiceGuardsItsRoutes(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, _ := n.DocsStream(t)
	nc.Close()
	const readTok, adminTok = "sk_read_0123456789abcdef", "sk_admin_0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("viewer read "+readTok+"\nops admin "+adminTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := stack.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }
	routes := map[string]http.Handler{
		"GET /v1/search":       http.HandlerFunc(ok),
		"POST /v1/admin/thing": http.HandlerFunc(ok),
	}
	logs := &testenv.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sc := projector.ServiceConfig{NATSURL: n.URL, MetricsAddr: addr, Runtime: projector.Config{Name: "guarded"},
		Security: auth.Settings{TokensFile: tokens}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, sc, log, func(ctx context.Context, sc projector.ServiceConfig, deps service.Deps) error {
			return projector.RunService(ctx, sc, newMemStore(), routes, deps)
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testenv.Eventually(t, "the projector to be ready", 20*time.Second, func() bool { return stack.HTTPOK("http://" + addr + "/readyz") })
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", "/v1/search", "", http.StatusUnauthorized},
		{"GET", "/v1/search", "sk_wrong_0123456789abcdef", http.StatusUnauthorized},
		{"GET", "/v1/search", readTok, http.StatusOK},
		{"GET", "/v1/search", adminTok, http.StatusForbidden},
		{"POST", "/v1/admin/thing", "", http.StatusUnauthorized},
		{"POST", "/v1/admin/thing", readTok, http.StatusForbidden},
		{"POST", "/v1/admin/thing", adminTok, http.StatusOK},
		{"GET", "/metrics", "", http.StatusOK},
		{"GET", "/healthz", "", http.StatusOK},
	} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		if c.token != "" {
			auth.SetBearer(req.Header, c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s with %q: %d, want %d", c.method, c.path, c.token, resp.StatusCode, c.want)
		}
	}
	metrics, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(metrics.Body)
	_ = metrics.Body.Close()
	for _, secret := range []string{readTok, adminTok, "sk_wrong_0123456789abcdef"} {
		if strings.Contains(string(body), secret) || logs.Contains(secret) {
			t.Errorf("a token reached the log or /metrics")
		}
	}
	if !strings.Contains(string(body), "converge_auth_refusals_total") {
		t.Errorf("/metrics does not count the refusals")
	}
}

// A projector started beyond loopback without tokens refuses to serve its
// routes, naming the flag that would allow it.
func TestRunServiceRefusesAnOpenListener(t *testing.T) {
	n := testenv.StartNATS(t)
	sc := projector.ServiceConfig{NATSURL: n.URL, MetricsAddr: "0.0.0.0:0", Runtime: projector.Config{Name: "open"}}
	err := service.Run(context.Background(), sc, slog.New(slog.DiscardHandler), func(ctx context.Context, sc projector.ServiceConfig, deps service.Deps) error {
		return projector.RunService(ctx, sc, newMemStore(), map[string]http.Handler{"GET /v1/search": http.NotFoundHandler()}, deps)
	})
	if err == nil || !strings.Contains(err.Error(), "-insecure-no-auth") {
		t.Fatalf("0.0.0.0 without tokens: %v", err)
	}
}

// A projector holds no Postgres credentials: its configuration refuses one.
func TestProjectorRefusesPostgresCredentials(t *testing.T) {
	t.Setenv(config.EnvPostgresURL, "postgres://someone@127.0.0.1/converge")
	f := config.NewFlags("projector")
	get := projector.ServiceFlags(f, "index", "")
	if err := f.Parse([]string{"-nats-url", "nats://127.0.0.1:4222"}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(); !errors.Is(err, projector.ErrPostgresCredentials) {
		t.Fatalf("with %s set: %v", config.EnvPostgresURL, err)
	}
}
