package service_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/service"
)

// clockChildEnv makes TestCommandClockChild run.
const clockChildEnv = "CONVERGE_SERVICE_TEST_CLOCK_CHILD"

// A service run by its command line, as every binary is, gets the
// process's wall clock in Deps, which honours clock.EnvFaultFile.
func TestCommandHandsTheFaultClockToTheService(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clock")
	if err := os.WriteFile(path, []byte("-90m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCommandClockChild$", "-test.v")
	cmd.Env = append(os.Environ(), clock.EnvFaultFile+"="+path, clockChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "deps clock offset -1h30m0s") {
		t.Fatalf("child's output, want the service's clock 90m behind:\n%s", out)
	}
}

func TestCommandClockChild(t *testing.T) {
	if os.Getenv(clockChildEnv) == "" {
		t.Skip("run by TestCommandHandsTheFaultClockToTheService")
	}
	bind := func(*config.Flags) func() (noConns, error) {
		return func() (noConns, error) { return noConns{}, nil }
	}
	err := service.Command(context.Background(), "clocked", nil, bind, func(_ context.Context, _ noConns, deps service.Deps) error {
		t.Logf("deps clock offset %v", time.Until(deps.Clock.Now()).Round(time.Minute))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
