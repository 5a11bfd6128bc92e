//go:build linux

package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/stack"
)

// credentialVars carry a credential: no child inherits them from the
// test's environment, each gets its own alone.
var credentialVars = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE", "PGPASSWORD", "PGPASSFILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE", natsauth.EnvCreds, natsauth.EnvNKey,
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
	"CONVERGE_OWNER_PASSWORD", "CONVERGE_WRITER_PASSWORD", "CONVERGE_RELAY_PASSWORD", "CONVERGE_READER_PASSWORD",
	"CONVERGE_WEBHOOK_SECRET", indexprojector.EnvQdrantAPIKey,
}

// service is one of converge's binaries run as a child process, restarted
// when it exits on its own (as `restart: unless-stopped` does in the
// compose stack): the suite's faults stop it, nothing else may.
type service struct {
	t    *testing.T
	name string
	bin  string
	args []string
	env  []string
	addr string // metrics address: /readyz
	log  *os.File

	mu       sync.Mutex
	child    *proc.Child
	stopped  bool // the suite stopped it: do not restart
	starts   int
	selfExit []string // exits the suite did not cause
}

func (s *service) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "=== chaos %s: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// start starts the process and the watcher that restarts it if it exits
// on its own.
func (s *service) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = false
	s.startLocked()
}

func (s *service) startLocked() {
	s.starts++
	s.logf("start %d", s.starts)
	c, err := proc.Start(s.bin, s.args, proc.Options{Env: s.env, Unset: credentialVars, Out: s.log})
	if err != nil {
		s.t.Errorf("start %s: %v", s.name, err)
		return
	}
	s.child = c
	go s.watch(c)
}

func (s *service) watch(c *proc.Child) {
	<-c.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.child != c || s.stopped {
		return
	}
	s.selfExit = append(s.selfExit, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), c.Err()))
	s.logf("exited on its own (%v); restarting in 500ms", c.Err())
	s.child = nil
	time.AfterFunc(500*time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.child == nil && !s.stopped {
			s.startLocked()
		}
	})
}

// argsNow is the process's arguments; setArgs changes them for its next
// start (a restart with another configuration).
func (s *service) argsNow() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string{}, s.args...)
}

func (s *service) setArgs(args []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.args = args
}

// kill SIGKILLs the process and reaps it; start brings it back.
func (s *service) kill() {
	s.mu.Lock()
	s.stopped = true
	c := s.child
	s.child = nil
	s.mu.Unlock()
	if c != nil {
		s.logf("SIGKILL")
		c.Kill()
	}
}

// pause SIGSTOPs the process, resume SIGCONTs it.
func (s *service) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.child != nil {
		s.logf("SIGSTOP")
		s.child.Pause()
	}
}

func (s *service) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.child != nil {
		s.child.Resume()
		s.logf("SIGCONT")
	}
}

func (s *service) ready() bool { return stack.HTTPOK("http://" + s.addr + "/readyz") }

// readyz is the body of /readyz when it answers other than 200: what is
// not ready, and why ("" when ready or unreachable).
func (s *service) readyz() string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return string(b)
}

// metric is the value of the unlabelled metric name on /metrics, "" when
// it cannot be read.
func (s *service) metric(name string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if len(line) > len(name) && line[:len(name)] == name && line[len(name)] == ' ' {
			return line[len(name)+1:]
		}
	}
	return ""
}

func (s *service) exits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.selfExit...)
}

// dumpGoroutines has the process write every goroutine's stack to its log
// (SIGQUIT, which also ends it; the suite restarts it unless stopped).
func (s *service) dumpGoroutines() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.child != nil {
		s.logf("SIGQUIT: goroutine dump")
		_ = syscall.Kill(s.child.Pid(), syscall.SIGQUIT)
	}
}
