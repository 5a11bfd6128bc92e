//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package embedded

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestLockAcrossProcesses opens the store in a child process and checks that
// this process is refused until the child exits.
func TestLockAcrossProcesses(t *testing.T) {
	if dir := os.Getenv("EMBEDDED_INDEX_HOLD_DIR"); dir != "" {
		s, err := Open(dir, Options{})
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("open\n")
		// Hold the store until the parent closes our stdin.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		_ = s.Close()
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockAcrossProcesses$")
	cmd.Env = append(os.Environ(), "EMBEDDED_INDEX_HOLD_DIR="+dir)
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "open\n" {
		_ = cmd.Process.Kill()
		t.Fatalf("child: %q %v", line, err)
	}
	_, err = Open(dir, Options{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), strconv.Itoa(cmd.Process.Pid)) {
		t.Errorf("Open while the child holds the store: %v, want ErrLocked naming pid %d", err, cmd.Process.Pid)
	}
	must(t, stdin.Close())
	must(t, cmd.Wait())
	s, err := Open(dir, Options{})
	must(t, err)
	must(t, s.Close())
}
