//go:build unix

package pgcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	// helperModeEnv makes TestHelperOwner act as a cluster owner process.
	helperModeEnv = "PGCLUSTER_HELPER_OWNER"
	// helperDirEnv is the Config.Dir the helper uses; empty for a temp dir.
	helperDirEnv = "PGCLUSTER_HELPER_DIR"
	// helperPrefix marks the helper's report line on stdout.
	helperPrefix = "PGCLUSTER_HELPER_OWNER "
)

// TestHelperOwner is not a real test: TestWatchdogOwnerKilled runs the test
// binary again with helperModeEnv set, and this function then starts a
// cluster, reports it on stdout and waits to be killed without Stop.
func TestHelperOwner(t *testing.T) {
	mode := os.Getenv(helperModeEnv)
	if mode == "" {
		t.Skip("helper process for TestWatchdogOwnerKilled")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{Dir: os.Getenv(helperDirEnv)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: Start: %v\n", err)
		os.Exit(2)
	}
	pm := c.pid()
	if mode == "stopkeep" {
		if err := c.StopKeep(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "helper: StopKeep: %v\n", err)
			os.Exit(2)
		}
	}
	fmt.Printf("%s%s %d %d\n", helperPrefix, filepath.Dir(c.DataDir()), pm, c.watchdogPID())
	// The parent kills us; should it die first, its end of stdin closes,
	// and leaving here without Stop exercises the watchdog just the same.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}

type ownerReport struct {
	root       string
	postmaster int
	watchdog   int
}

// startOwner runs TestHelperOwner in a child process and returns what it
// started, with the child still running.
func startOwner(t *testing.T, mode, dir string) (*exec.Cmd, ownerReport) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOwner$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, helperDirEnv+"="+dir)
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Held open until the test ends: the helper waits for its end.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close() })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	lines := make(chan string, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), helperPrefix); ok {
				lines <- s
				return
			}
		}
	}()
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("helper exited without a report; stderr:\n%s", stderr)
		}
		line = l
	case <-time.After(3 * time.Minute):
		t.Fatalf("helper did not report within 3m; stderr:\n%s", stderr)
	}
	var r ownerReport
	if _, err := fmt.Sscanf(line, "%s %d %d", &r.root, &r.postmaster, &r.watchdog); err != nil {
		t.Fatalf("bad helper report %q: %v", line, err)
	}
	t.Cleanup(func() {
		// Should the watchdog fail, do not leave its server behind.
		if processAlive(r.postmaster) {
			_ = quitProcess(r.postmaster)
			waitExit(r.postmaster, 10*time.Second)
		}
	})
	return cmd, r
}

// eventually polls cond for up to 15 s.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

func TestWatchdogOwnerKilled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		mode        string
		explicitDir bool
	}{
		{name: "TempDir", mode: "running"},
		{name: "ExplicitDir", mode: "running", explicitDir: true},
		{name: "TempDirAfterStopKeep", mode: "stopkeep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dir string
			if tc.explicitDir {
				dir = accessibleTempDir(t)
			}
			owner, r := startOwner(t, tc.mode, dir)
			if r.watchdog <= 0 || !processAlive(r.watchdog) {
				t.Fatalf("no live watchdog reported (pid %d)", r.watchdog)
			}
			if tc.mode == "running" && !processAlive(r.postmaster) {
				t.Fatalf("postmaster %d not running before the owner is killed", r.postmaster)
			}
			if !exists(r.root) {
				t.Fatalf("cluster dir %s missing before the owner is killed", r.root)
			}

			killed := time.Now()
			if err := owner.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			// Wait copies the owner's stderr until EOF, so it would stall for
			// WaitDelay if the watchdog had inherited that pipe.
			_ = owner.Wait()
			if d := time.Since(killed); d > 5*time.Second {
				t.Errorf("waiting for the killed owner took %v: a child holds its stderr", d)
			}

			if !eventually(func() bool { return !processAlive(r.postmaster) }) {
				t.Fatalf("postmaster %d still running 15s after its owner was killed", r.postmaster)
			}
			if !eventually(func() bool { return !processAlive(r.watchdog) }) {
				t.Fatalf("watchdog %d still running 15s after its owner was killed", r.watchdog)
			}
			if tc.explicitDir {
				// The watchdog has exited, so it is done with the directory.
				if !exists(filepath.Join(r.root, "data", "PG_VERSION")) {
					t.Errorf("watchdog removed the caller-provided Dir %s", r.root)
				}
			} else if exists(r.root) {
				t.Errorf("temp dir %s not removed after the owner was killed", r.root)
			}
			t.Logf("cleaned up %v after the owner was killed", time.Since(killed).Round(time.Millisecond))
		})
	}
}

func TestWatchdogFollowsLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	var seen []int
	// step checks that the cluster has a live watchdog different from all
	// earlier ones, and that the earlier ones are gone.
	step := func(what string) {
		t.Helper()
		pid := c.watchdogPID()
		if pid <= 0 || !processAlive(pid) {
			t.Fatalf("%s: no live watchdog (pid %d)", what, pid)
		}
		for _, old := range seen {
			if old == pid {
				t.Fatalf("%s: watchdog %d was not replaced", what, pid)
			}
			if processAlive(old) {
				t.Errorf("%s: previous watchdog %d still running", what, old)
			}
		}
		seen = append(seen, pid)
	}

	step("Start")
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	step("Kill") // a temp dir is still guarded
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	step("Restart after Kill")
	if err := c.StopKeep(ctx); err != nil {
		t.Fatalf("StopKeep: %v", err)
	}
	step("StopKeep")
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	step("Restart after StopKeep")
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if pid := c.watchdogPID(); pid != 0 {
		t.Errorf("watchdog %d still recorded after Stop", pid)
	}
	for _, pid := range seen {
		if processAlive(pid) {
			t.Errorf("watchdog %d still running after Stop", pid)
		}
	}
}

func TestWatchdogExplicitDirEndsWithServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, err := Start(ctx, Config{Dir: accessibleTempDir(t)})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	pid := c.watchdogPID()
	if pid <= 0 || !processAlive(pid) {
		t.Fatalf("no live watchdog (pid %d)", pid)
	}
	// Nothing of a caller-provided Dir is left to guard once the server is
	// down, so no process may linger.
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if got := c.watchdogPID(); got != 0 || processAlive(pid) {
		t.Errorf("after Kill: watchdog recorded %d, old %d alive %v; want none", got, pid, processAlive(pid))
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	pid = c.watchdogPID()
	if pid <= 0 || !processAlive(pid) {
		t.Fatalf("no live watchdog after Restart (pid %d)", pid)
	}
	if err := c.StopKeep(ctx); err != nil {
		t.Fatalf("StopKeep: %v", err)
	}
	if got := c.watchdogPID(); got != 0 || processAlive(pid) {
		t.Errorf("after StopKeep: watchdog recorded %d, old %d alive %v; want none", got, pid, processAlive(pid))
	}
}

func TestNoWatchdog(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Config{NoWatchdog: true})
	if pid := c.watchdogPID(); pid != 0 {
		t.Errorf("NoWatchdog: watchdog %d started", pid)
	}
}
