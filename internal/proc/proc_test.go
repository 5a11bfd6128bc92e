package proc_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/testenv"
)

func sh(t *testing.T) string {
	p, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	return p
}

func TestStopIsCleanOnSIGTERM(t *testing.T) {
	var out testenv.Buffer
	c, err := proc.Start(sh(t), []string{"-c", `trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done`}, proc.Options{Out: &out, Env: []string{"X=1"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { return strings.Contains(out.String(), "up") })
	if err := c.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !c.Exited() || !strings.Contains(out.String(), "bye") {
		t.Fatalf("exited %v, output %q: want the TERM trap's line", c.Exited(), out.String())
	}
}

func TestStopKillsAChildThatIgnoresSIGTERM(t *testing.T) {
	var out testenv.Buffer
	c, err := proc.Start(sh(t), []string{"-c", `trap '' TERM; echo up; while :; do sleep 0.05; done`}, proc.Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { return strings.Contains(out.String(), "up") })
	if err := c.Stop(200 * time.Millisecond); !errors.Is(err, proc.ErrKilled) {
		t.Fatalf("Stop of a child ignoring SIGTERM: %v, want proc.ErrKilled", err)
	}
	if !c.Exited() {
		t.Fatal("not reaped")
	}
}

// state is the process state letter of pid from /proc ("T": stopped).
func state(t *testing.T, pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skip("no /proc")
	}
	// pid (comm) STATE ...: comm may hold spaces, so read after its ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0]
}

func TestPauseStopsTheChildUntilResume(t *testing.T) {
	var out testenv.Buffer
	c, err := proc.Start(sh(t), []string{"-c", `i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done`}, proc.Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill()
	waitFor(t, "output", func() bool { return strings.Count(out.String(), "\n") >= 3 })
	c.Pause()
	waitFor(t, "the kernel to stop the child", func() bool { return state(t, c.Pid()) == "T" })
	before := out.String()
	c.Resume()
	waitFor(t, "the child to run and write again", func() bool { return state(t, c.Pid()) != "T" && out.String() != before })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKillEndsAndReaps(t *testing.T) {
	c, err := proc.Start(sh(t), []string{"-c", "sleep 60"}, proc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.Kill()
	if !c.Exited() || c.Err() == nil {
		t.Fatalf("after Kill: exited %v, err %v", c.Exited(), c.Err())
	}
}

func TestEnvAddsAndUnsets(t *testing.T) {
	t.Setenv("PROC_TEST_KEEP", "kept")
	t.Setenv("PROC_TEST_DROP", "secret")
	var out testenv.Buffer
	c, err := proc.Start(sh(t), []string{"-c", `echo "keep=$PROC_TEST_KEEP drop=${PROC_TEST_DROP-unset} add=$PROC_TEST_ADD"`},
		proc.Options{Out: &out, Env: []string{"PROC_TEST_ADD=added"}, Unset: []string{"PROC_TEST_DROP"}})
	if err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if got, want := strings.TrimSpace(out.String()), "keep=kept drop=unset add=added"; got != want {
		t.Fatalf("child saw %q, want %q", got, want)
	}
}

// A paused child still stops cleanly: Stop resumes it so that it can
// handle SIGTERM, rather than waiting out the grace and killing it.
func TestStopResumesAPausedChild(t *testing.T) {
	var out testenv.Buffer
	c, err := proc.Start(sh(t), []string{"-c", `trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done`}, proc.Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { return out.Contains("up") })
	c.Pause()
	waitFor(t, "the kernel to stop the child", func() bool { return state(t, c.Pid()) == "T" })
	if err := c.Stop(30 * time.Second); err != nil {
		t.Fatalf("Stop of a paused child: %v", err)
	}
	if !out.Contains("bye") {
		t.Fatalf("the child did not handle SIGTERM: %q", out.String())
	}
}
