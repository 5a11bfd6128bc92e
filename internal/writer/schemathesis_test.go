package writer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

// TestSchemathesis fuzzes the running writer with Schemathesis (make fuzz
// sets CONVERGE_SCHEMATHESIS to its executable; skipped otherwise): the
// writer service over its own Postgres, with bearer tokens, every
// built-in check of Schemathesis (no 5xx, every answer valid against
// api/openapi.json, invalid input refused, valid input accepted, the
// token enforced) and the checks of test/schemathesis/hooks.py. Then
// Postgres must hold nothing but what the writer answered as accepted:
// each document row one an accepted write stored, each outbox event one an
// accepted write or re-emission answered with. Settings from the
// environment: FUZZ_EXAMPLES (examples per operation, default 100),
// FUZZ_SEED, FUZZ_REPORT (a directory for Schemathesis' JUnit report).
func TestSchemathesis(t *testing.T) {
	bin := os.Getenv("CONVERGE_SCHEMATHESIS")
	if bin == "" {
		t.Skip("CONVERGE_SCHEMATHESIS is not set: make fuzz installs Schemathesis and sets it")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokensPath := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokensPath, []byte(contractTokens), 0o600); err != nil {
		t.Fatal(err)
	}
	url := pg.MigratedDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs testenv.LockedBuffer
	deps := service.Deps{Log: slog.New(slog.NewTextHandler(&logs, nil)), Registry: telemetry.NewRegistry(), Postgres: pool}
	cfg := writer.ServiceConfig{PostgresURL: "unused: the pool is given", HTTPAddr: "127.0.0.1:0", TokensFile: tokensPath,
		ShutdownGrace: 5 * time.Second}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("writer log:\n%s", logs.String())
		}
	})
	base := "http://" + startService(t, cfg, deps)

	accepted := filepath.Join(dir, "accepted.jsonl")
	examples := envOr("FUZZ_EXAMPLES", "100")
	args := []string{"--config-file", filepath.Join(root, "test/schemathesis/schemathesis.toml"),
		"run", base + "/openapi.json", "--url", base,
		"-H", "Authorization: Bearer " + tokenAll,
		"--max-examples", examples, "--workers", "2",
		"--request-timeout", "30", "--no-color", "--suppress-health-check", "all"}
	if seed := os.Getenv("FUZZ_SEED"); seed != "" {
		args = append(args, "--seed", seed)
	}
	if report := os.Getenv("FUZZ_REPORT"); report != "" {
		args = append(args, "--report", "junit", "--report-dir", report)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"SCHEMATHESIS_HOOKS=hooks",
		"PYTHONPATH="+filepath.Join(root, "test/schemathesis"),
		"CONVERGE_ACCEPTED_LOG="+accepted)
	out, err := cmd.CombinedOutput()
	summary := schemathesisSummary(string(out))
	shown := strings.Join(args[2:], " ")
	shown = strings.ReplaceAll(shown, tokenAll, "[token]")
	t.Logf("schemathesis %s:\n%s", shown, out)
	if err != nil {
		t.Fatalf("schemathesis failed (%v): %s", err, summary)
	}
	t.Logf("summary: %s", summary)

	// Nothing is stored that the writer did not answer as accepted.
	stored, events := readAccepted(t, accepted)
	if len(stored) == 0 {
		t.Fatal("no write was accepted in the whole run: the fuzzing sent nothing valid")
	}
	var docs, outbox int
	rows, err := pool.Query(context.Background(), `SELECT key, version FROM documents`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		var version int64
		if err := rows.Scan(&key, &version); err != nil {
			t.Fatal(err)
		}
		docs++
		if !stored[fmt.Sprintf("%q@%d", key, version)] {
			t.Errorf("documents holds %q at version %d, which no accepted write stored", key, version)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(context.Background(), `SELECT DISTINCT event_id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		outbox++
		if !events[id] {
			t.Errorf("the outbox holds event %s, which no accepted write or re-emission answered with", id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Postgres after the run: %d documents and %d events, each one an accepted write answered with (%d distinct writes accepted)", docs, outbox, len(stored))
}

// readAccepted reads the hooks' log of accepted writes: the (key, version)
// each applied write stored, and every event id an accepted write or
// re-emission answered with.
func readAccepted(t *testing.T, path string) (stored, events map[string]bool) {
	t.Helper()
	stored, events = map[string]bool{}, map[string]bool{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return stored, events
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct {
			Key     string `json:"key"`
			Version int64  `json:"version"`
			EventID string `json:"event_id"`
			Result  string `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if e.Result != "stale" { // a stale write's event is the one it would have had
			events[e.EventID] = true
		}
		if e.Result == "applied" {
			stored[fmt.Sprintf("%q@%d", e.Key, e.Version)] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stored, events
}

// schemathesisSummary is the tail of Schemathesis' output from its summary
// header on.
func schemathesisSummary(out string) string {
	if i := strings.LastIndex(out, "SUMMARY"); i >= 0 {
		return strings.TrimSpace(regexp.MustCompile(`=+`).ReplaceAllString(out[i:], ""))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
