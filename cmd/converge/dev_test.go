package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/pkg/contract"
)

// devDatabase is a fresh database for a dev stack, its slots dropped when
// the test ends.
func devDatabase(t *testing.T) string {
	t.Helper()
	dbURL := pg.NewDatabase(t)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dbURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`)
			_ = c.Close(context.Background())
		}
	})
	return dbURL
}

// devConfig is the dev stack's configuration on dbURL, as `converge dev`
// parses it, on free addresses.
func devConfig(t *testing.T, dbURL string) stack.Config {
	t.Helper()
	f := config.NewFlags("test")
	flags := devFlags(f, stack.Config{DataDir: t.TempDir()})
	if err := f.Parse([]string{"-postgres-url", dbURL, "-log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := flags()
	if err != nil {
		t.Fatal(err)
	}
	freeAddrs(t, &cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr, &cfg.NotifierAddr)
	return cfg
}

// freeAddrs sets each of addrs to a free loopback address.
func freeAddrs(t *testing.T, addrs ...*string) {
	t.Helper()
	for _, a := range addrs {
		addr, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*a = addr
	}
}

// status asks `converge status --json` with the environment as it is.
func statusJSON(ctx context.Context, dbURL, natsURL string) (statusReport, error) {
	var out bytes.Buffer
	var rep statusReport
	if err := run(ctx, []string{"status", "-postgres-url", dbURL, "-nats-url", natsURL, "--json"}, &out); err != nil {
		return rep, err
	}
	return rep, json.Unmarshal(out.Bytes(), &rep)
}

// The dev stack runs every service with its own NATS user, and nothing
// connects without one; its writer and projectors refuse a request
// without a token (401) or with a token of another scope (403), and answer
// the stack's own tokens.
func TestDevStackServicesUseTheirOwnCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dbURL := devDatabase(t)
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer receiver.Close()
	t.Setenv("CONVERGE_WEBHOOK_URLS", receiver.URL)
	t.Setenv("CONVERGE_WEBHOOK_SECRET", "test-secret")
	// The caller's own credentials are not the graph child's.
	t.Setenv(natsauth.EnvUser, "someone")
	t.Setenv(natsauth.EnvPassword, "not-the-child's")

	cfg := devConfig(t, dbURL)
	cfg.GraphChild, cfg.LogOut = true, io.Discard
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	// Each connection is its service's, as its own user.
	want := map[string]string{
		"converge-writer": natsauth.UserWriter, "converge-relay": natsauth.UserRelay,
		"converge-projector-index": natsauth.UserIndex, "converge-projector-graph": natsauth.UserGraph,
		"converge-notifier": natsauth.UserNotifier,
	}
	var seen map[string]string
	var stray []string
	err = stack.WaitUntil(ctx, ctx, 30*time.Second, func() bool {
		cz, err := s.NATS.Server.Connz(&server.ConnzOptions{Username: true, Limit: 1000})
		if err != nil {
			return false
		}
		seen, stray = map[string]string{}, nil
		for _, c := range cz.Conns {
			if want[c.Name] == "" || c.AuthorizedUser != want[c.Name] {
				stray = append(stray, c.Name+" as "+c.AuthorizedUser)
				continue
			}
			seen[c.Name] = c.AuthorizedUser
		}
		return len(seen) == len(want) && len(stray) == 0
	})
	if err != nil {
		t.Fatalf("connections %v, others %v; want each service as its own user: %v", seen, stray, want)
	}
	if nc, err := nats.Connect(s.NATSURL); err == nil {
		nc.Close()
		t.Error("the dev stack's NATS server admits a client without credentials")
	}

	for path, mode := range map[string]os.FileMode{s.TokensFile: 0o600, s.OperatorTokenFile: 0o600, s.WriterTokenFile: 0o600, s.OperatorNATSPasswordFile: 0o600} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %v", path, fi.Mode(), err, mode)
		}
	}

	// The writer: write scope only.
	put := func(token string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s.APIURL+"/v1/documents/dev-a", strings.NewReader(`{"version":1,"body":"a body"}`))
		req.Header.Set("Content-Type", "application/json")
		auth.SetBearer(req.Header, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		who   string
		token string
		want  int
	}{{"no token", "", http.StatusUnauthorized}, {"an unknown token", "an-unknown-token-0123456789", http.StatusUnauthorized},
		{"the operator's token", s.OperatorToken, http.StatusForbidden}, {"the writer-client's token", s.WriterToken, http.StatusOK}} {
		if got := put(tc.token); got != tc.want {
			t.Errorf("PUT a document with %s: %d, want %d", tc.who, got, tc.want)
		}
	}
	// A projector: read scope for search.
	var apiErr *index.APIError
	if _, err := (&index.Client{Addr: s.IndexAddr}).Search(ctx, "body", 1); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Errorf("search without a token: %v, want 401", err)
	}
	if _, err := (&index.Client{Addr: s.IndexAddr, Token: s.WriterToken}).Search(ctx, "body", 1); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusForbidden {
		t.Errorf("search with the writer-client's token: %v, want 403", err)
	}
	if err := stack.WaitUntil(ctx, ctx, 30*time.Second, func() bool {
		res, err := (&index.Client{Addr: s.IndexAddr, Token: s.OperatorToken}).Search(ctx, "body", 1)
		return err == nil && len(res.Results) == 1 && res.Results[0].Key == "dev-a"
	}); err != nil {
		t.Errorf("search with the operator's token: %v", err)
	}
	if !stack.HTTPOK("http://" + s.IndexAddr + "/metrics") {
		t.Error("/metrics of the index projector needs a token")
	}

	// converge status and replay as the operator's NATS user; without
	// it they are refused.
	t.Setenv(natsauth.EnvUser, "")
	if err := os.Unsetenv(natsauth.EnvPassword); err != nil { // restored by the Setenv above
		t.Fatal(err)
	}
	if _, err := statusJSON(ctx, dbURL, s.NATSURL); err == nil {
		t.Error("converge status without NATS credentials: no error")
	}
	t.Setenv(natsauth.EnvUser, natsauth.UserOperator)
	t.Setenv(natsauth.EnvPassword+"_FILE", s.OperatorNATSPasswordFile)
	rep, err := statusJSON(ctx, dbURL, s.NATSURL)
	if err != nil {
		t.Fatalf("converge status as the operator: %v", err)
	}
	if len(rep.Streams) == 0 || rep.Streams[0].Name != contract.DocsStream || !rep.Streams[0].Exists || len(rep.Consumers) == 0 {
		t.Fatalf("converge status as the operator: streams %+v consumers %+v", rep.Streams, rep.Consumers)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"replay", "index", "--from-seq", "1", "-nats-url", s.NATSURL}, &out); err != nil || !strings.Contains(out.String(), "consumer index of CONVERGE_DOCS now delivers from sequence 1") {
		t.Fatalf("converge replay as the operator: %v %q", err, out.String())
	}
}

// lockedBuffer is a bytes.Buffer written by one goroutine and read by
// another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// converge dev's banner says where the tokens and the operator's NATS
// password are, and how to use them, without showing any of them.
func TestDevBannerNamesTheOperatorsCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	dbURL := devDatabase(t)
	dir := t.TempDir()
	t.Setenv("CONVERGE_WEBHOOK_URLS", "")
	args := []string{"-postgres-url", dbURL, "-data-dir", dir, "-log-level", "error"}
	for _, flag := range []string{"-http-addr", "-writer-metrics-addr", "-relay-metrics-addr", "-index-addr", "-graph-addr"} {
		a, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, flag, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- dev(runCtx, args, &out) }()
	if err := stack.WaitUntil(ctx, ctx, 90*time.Second, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
			return strings.Contains(out.String(), "Ctrl-C stops everything")
		}
	}); err != nil {
		t.Fatalf("no banner: %v\n%s", err, out.String())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("dev: %v\n%s", err, out.String())
	}
	banner := out.String()
	t.Logf("banner:\n%s", banner)
	for _, want := range []string{
		"tokens         " + dir + "/tokens (operator: admin,read; writer-client: write)",
		"as operator    export CONVERGE_TOKEN_FILE=" + dir + "/operator.token",
		"export CONVERGE_NATS_USER=operator CONVERGE_NATS_PASSWORD_FILE=" + dir + "/operator.nats-password",
		`curl -H "Authorization: Bearer $(cat ` + dir + `/writer-client.token)"`,
		"(each service as its own user)",
		"CONVERGE_POSTGRES_URL_FILE=" + dir + "/reader.postgres-url",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner lacks %q", want)
		}
	}
	for _, f := range []string{"operator.token", "writer-client.token", "operator.nats-password", "reader.postgres-url"} {
		secret, err := os.ReadFile(dir + "/" + f)
		if err != nil || len(bytes.TrimSpace(secret)) < auth.MinTokenBytes {
			t.Fatalf("%s: %q %v", f, secret, err)
		}
		if strings.Contains(banner, string(bytes.TrimSpace(secret))) {
			t.Errorf("the banner shows the secret of %s", f)
		}
	}
}
