// Package proc runs converge's own binaries as child processes: `converge
// dev` and the demo (a graph projector that the demo kills), the
// end-to-end tests and the benchmark of the deployed layout. A child dies
// with the process that started it (on Linux), is reaped when it exits,
// and can be stopped, killed, paused and resumed.
package proc

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options of a child.
type Options struct {
	// Env is added to this process's environment.
	Env []string
	// Unset names variables of this process's environment the child
	// does not get (credentials that are not its own, say).
	Unset []string
	// Out receives the child's stdout and stderr; nil: discarded.
	Out io.Writer
}

// Child is a running (or exited) child process.
type Child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited and been reaped
	err  error         // its exit, once done

	mu     sync.Mutex
	paused bool
}

// Start starts path with args.
func Start(path string, args []string, opt Options) (*Child, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = append(environ(opt.Unset), opt.Env...)
	if opt.Out != nil {
		cmd.Stdout, cmd.Stderr = opt.Out, opt.Out
	}
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	return c, nil
}

// environ is this process's environment without the variables named in
// unset.
func environ(unset []string) []string {
	env := os.Environ()
	if len(unset) == 0 {
		return env
	}
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(unset, name) {
			out = append(out, kv)
		}
	}
	return out
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed once the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Err is the child's exit (nil for status 0), once it has exited; nil
// before.
func (c *Child) Err() error {
	if !c.Exited() {
		return nil
	}
	return c.err
}

// ErrKilled is Stop's error for a child that had to be killed.
var ErrKilled = errors.New("proc: the child did not stop in time and was killed")

// Stop asks the child to stop (SIGTERM; a paused child is resumed first so
// that it can), SIGKILLs it if it has not exited within grace, and returns
// its exit: nil for a clean one, ErrKilled when it was killed.
func (c *Child) Stop(grace time.Duration) error {
	if c.Exited() {
		return c.err
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	c.Resume()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return c.err
	case <-t.C:
		c.Kill()
		return ErrKilled
	}
}

// Kill SIGKILLs the child and waits until it is reaped.
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Pause stops the child (SIGSTOP) until Resume: it holds its connections
// and does nothing.
func (c *Child) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused && !c.Exited() {
		_ = c.cmd.Process.Signal(syscall.SIGSTOP)
		c.paused = true
	}
}

// Resume continues a paused child (SIGCONT).
func (c *Child) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		c.paused = false
	}
}
