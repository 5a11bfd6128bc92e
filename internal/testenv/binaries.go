package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Binaries are the commands under cmd/, built once per test process as the
// Dockerfile builds them: CGO_ENABLED=0 go build -trimpath ./cmd/...
type Binaries struct {
	Dir   string   // where they are
	Names []string // their names, sorted: "converge", "relay", "writer", ...
}

// Path is the file of the command name.
func (b *Binaries) Path(name string) string {
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	return filepath.Join(b.Dir, name)
}

var binaries struct {
	mu    sync.Mutex
	built *Binaries
	users int // tests that hold built and have not ended
}

// BuildBinaries builds every command of the module into a temporary
// directory and returns them. Tests of one process share one build; its
// directory is removed when the last test using it ends, and a later test
// builds again (from Go's build cache, so mostly linking).
func BuildBinaries(t testing.TB) *Binaries {
	t.Helper()
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.built == nil {
		b, err := buildBinaries()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		binaries.built = b
	}
	binaries.users++
	b := binaries.built
	t.Cleanup(func() {
		binaries.mu.Lock()
		defer binaries.mu.Unlock()
		if binaries.users--; binaries.users == 0 {
			_ = os.RemoveAll(b.Dir)
			binaries.built = nil
		}
	})
	return b
}

func buildBinaries() (*Binaries, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "converge-bin-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+string(filepath.Separator), "./cmd/...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./cmd/... in %s: %w\n%s", root, err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	b := &Binaries{Dir: dir}
	for _, e := range entries {
		b.Names = append(b.Names, strings.TrimSuffix(e.Name(), ".exe"))
	}
	slices.Sort(b.Names)
	if len(b.Names) == 0 {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./cmd/... in %s built nothing", root)
	}
	return b, nil
}

// moduleRoot is the directory of the go.mod the test runs in (a test runs
// in its package's directory), or else of the one above this source file.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if gomod := string(bytes.TrimSpace(out)); err == nil && gomod != "" && gomod != os.DevNull {
		return filepath.Dir(gomod), nil
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		// internal/testenv/binaries.go
		return filepath.Join(filepath.Dir(file), "..", ".."), nil
	}
	return "", fmt.Errorf("cannot find the module root: go env GOMOD: %w %q", err, out)
}
