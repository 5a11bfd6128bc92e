package auth_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/testenv"
)

const (
	writeToken = "sk_write_0123456789abcdef"
	adminToken = "sk_admin_0123456789abcdef"
	readToken  = "sk_read_0123456789abcdefg"
	newToken   = "sk_new_0123456789abcdefgh"
)

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	// Renamed into place, as an operator's tooling does, so a reload never
	// reads half a file.
	if err := os.WriteFile(path+".new", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

func tokensFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, path, text)
	return path
}

const threeTokens = "# clients of the writer\n" +
	"writer-client write " + writeToken + "\n" +
	"ops admin " + adminToken + "\n" +
	"reader read " + readToken + "\n"

// status asks h for a route that needs scope with the token.
func status(t *testing.T, tokens *auth.Tokens, scope auth.Scope, token string) int {
	t.Helper()
	h := auth.NewGuard(tokens, nil, nil).Require(scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	req := httptest.NewRequest("POST", "/x", nil)
	auth.SetBearer(req.Header, token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

func TestReloadKeepsThePreviousTokensOnABadFile(t *testing.T) {
	path := tokensFile(t, threeTokens)
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tokens.Len() != 3 || tokens.Path() != path || !tokens.Enabled() {
		t.Fatalf("loaded %d tokens from %s", tokens.Len(), tokens.Path())
	}
	writeFile(t, path, "writer-client write "+writeToken+"\nbroken write short\n")
	if err := tokens.Reload(); !errors.Is(err, auth.ErrShortToken) || !strings.Contains(err.Error(), ":2") {
		t.Fatalf("reload of a bad file: %v", err)
	}
	if status(t, tokens, auth.Admin, adminToken) != 200 {
		t.Fatal("a failed reload dropped the previous tokens")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := tokens.Reload(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reload of a missing file: %v", err)
	}
	if status(t, tokens, auth.Admin, adminToken) != 200 {
		t.Fatal("a missing file dropped the previous tokens")
	}
	writeFile(t, path, "writer-client write "+newToken+"\n")
	if err := tokens.Reload(); err != nil {
		t.Fatal(err)
	}
	if status(t, tokens, auth.Write, newToken) != 200 || status(t, tokens, auth.Write, writeToken) != 401 || tokens.Len() != 1 {
		t.Fatal("the reloaded file is not in force")
	}
}

func TestLoadRefusesABadFile(t *testing.T) {
	if _, err := auth.Load(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	path := tokensFile(t, "# empty\n")
	if _, err := auth.Load(path); !errors.Is(err, auth.ErrNoTokens) {
		t.Fatalf("empty file: %v", err)
	}
}

// A real SIGHUP to this process reloads the file while Watch runs.
func TestWatchReloadsOnSIGHUP(t *testing.T) {
	// SIGHUP's default action ends the process. This channel, registered
	// first and never stopped, keeps it caught for the rest of the test
	// binary, whether Watch has registered yet or has already returned.
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGHUP)

	path := tokensFile(t, threeTokens)
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tokens.Watch(ctx, log) }()
	defer func() { cancel(); <-done }()

	// hupUntil sends SIGHUP until cond holds: the first ones may come
	// before Watch has registered.
	hupUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s after SIGHUP; log:\n%s", what, logs.String())
			}
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	writeFile(t, path, "writer-client write "+newToken+"\n")
	hupUntil("reload", func() bool { return status(t, tokens, auth.Write, newToken) == 200 })
	if status(t, tokens, auth.Write, writeToken) != 401 {
		t.Fatal("the token removed from the file is still accepted")
	}

	writeFile(t, path, "writer-client write "+newToken+"\nbad nope "+writeToken+"\n")
	hupUntil("refused reload", func() bool { return strings.Contains(logs.String(), "not reloaded") })
	if status(t, tokens, auth.Write, newToken) != 200 {
		t.Fatal("a bad file on SIGHUP dropped the tokens in force")
	}
	for _, tok := range []string{writeToken, newToken, adminToken, readToken} {
		if strings.Contains(logs.String(), tok) {
			t.Fatalf("the log shows a token:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "tokens file reloaded") {
		t.Fatalf("the reload was not logged:\n%s", logs.String())
	}
}
