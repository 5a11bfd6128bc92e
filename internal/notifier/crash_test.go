//go:build linux

package notifier

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// childEnv makes the test binary run a notifier that stops dead at the
// stage it names ("claimed": after the claim, before the send; "sent":
// after the send, before the mark), so that the test can SIGKILL it there.
const childEnv = "CONVERGE_NOTIFIER_TEST_CHILD"

func TestMain(m *testing.M) {
	switch kind := os.Getenv(childEnv); {
	case kind == "":
	case kind == effectsChild:
		os.Exit(runEffectsChild())
	case strings.HasPrefix(kind, partitionsChild):
		os.Exit(runPartitionsChild(strings.TrimPrefix(kind, partitionsChild)))
	default:
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// crashConsumer is the durable consumer of the crash tests' notifiers; its
// acknowledgement wait is short so that the killed child's messages come
// back soon.
const crashConsumer = "notifier"

func crashRuntime(name string) projector.Config {
	return projector.Config{Name: name, EveryEvent: true, BatchSize: 16, AckWait: time.Second,
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}
}

// runChild runs the notifier on CONVERGE_NATS_URL for the URLs in
// CONVERGE_WEBHOOK_URLS; at the first effect reaching the stage it prints
// "<stage> <effect id>" and blocks until killed.
func runChild() int {
	stage := os.Getenv(childEnv)
	cfg := crashConfig(strings.Split(os.Getenv(EnvWebhookURLs), ","))
	return runNotifierChild(cfg, crashRuntime(crashConsumer), func(n *Notifier, _ *projector.Runtime) {
		var once sync.Once
		n.hook = func(s string, effect uuid.UUID) {
			if s != stage {
				return
			}
			stop := false
			once.Do(func() {
				fmt.Printf("%s %s\n", s, effect)
				stop = true
			})
			if stop {
				select {} // until SIGKILL
			}
		}
	})
}

// runNotifierChild is the body of every notifier child: it runs a
// notifier with cfg, owned by "child", on CONVERGE_NATS_URL under a
// runtime with rc until it is killed; prepare, when set, is given both
// before the run. It returns the exit code: 2 when the setup failed, 1
// when the run did.
func runNotifierChild(cfg Config, rc projector.Config, prepare func(*Notifier, *projector.Runtime)) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	nc, err := nats.Connect(os.Getenv("CONVERGE_NATS_URL"))
	if err != nil {
		log.Error("nats", "err", err)
		return 2
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Error("jetstream", "err", err)
		return 2
	}
	cfg.Owner = "child"
	n, err := New(context.Background(), js, cfg, nil, log)
	if err != nil {
		log.Error("notifier", "err", err)
		return 2
	}
	r, err := projector.New(js, n, rc, nil, log)
	if err != nil {
		log.Error("projector", "err", err)
		return 2
	}
	if prepare != nil {
		prepare(n, r)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// notifierChild is the test binary run as a notifier child, to be
// SIGKILLed.
type notifierChild struct {
	cmd   *exec.Cmd
	logs  *testenv.LockedBuffer
	lines chan string // its first line on stdout
}

// startChild starts a notifier child of kind (the value of childEnv) on
// e's server for urls. The cleanup kills it and, when the test failed,
// logs what it wrote to stderr.
func startChild(t *testing.T, e *env, kind string, urls []string) *notifierChild {
	t.Helper()
	c := &notifierChild{cmd: exec.Command(os.Args[0], "-test.run=^$"), logs: &testenv.LockedBuffer{}, lines: make(chan string, 1)}
	c.cmd.Env = append(os.Environ(), childEnv+"="+kind, "CONVERGE_NATS_URL="+e.n.URL, EnvWebhookURLs+"="+strings.Join(urls, ","))
	c.cmd.Stderr = c.logs
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() {
			t.Logf("the notifier child's output:\n%s", c.logs.String())
		}
	})
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		c.lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return c
}

// firstLine is the first line the child printed, once it did what (within
// 30 s).
func (c *notifierChild) firstLine(t *testing.T, what string) string {
	t.Helper()
	select {
	case line := <-c.lines:
		return line
	case <-time.After(30 * time.Second):
		t.Fatalf("the notifier child did not %s within 30s", what)
		return ""
	}
}

// kill SIGKILLs the child and waits for its end.
func (c *notifierChild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

func crashConfig(urls []string) Config {
	cfg := testConfig(urls...)
	cfg.HTTPTimeout = 500 * time.Millisecond
	cfg.ClaimTimeout = time.Second
	cfg.SendWait = 100 * time.Millisecond
	return cfg
}

// crashAt runs a notifier child until one effect reaches stage, SIGKILLs
// it there, and returns that effect's id and what the receiver had seen of
// it at the kill.
func crashAt(t *testing.T, e *env, rcv *receiver, stage string, urls []string) (uuid.UUID, int) {
	t.Helper()
	child := startChild(t, e, stage, urls)
	line := child.firstLine(t, "reach "+stage)
	s, id, ok := strings.Cut(line, " ")
	effect, err := uuid.Parse(id)
	if !ok || s != stage || err != nil {
		t.Fatalf("the child said %q", line)
	}
	seen := 0
	for _, q := range rcv.requests() {
		if q.Key == effect.String() {
			seen++
		}
	}
	child.kill(t)
	return effect, seen
}

// runAfterCrash runs a notifier on the same consumer as the killed child
// until it caught up, and checks what every effect got: at least one POST,
// at most two (one before the kill, one after), all with the one key the
// contract derives.
func runAfterCrash(t *testing.T, e *env, rcv *receiver, urls []string, effects int) *Metrics {
	t.Helper()
	m := NewMetrics(nil)
	n, err := New(context.Background(), e.js, crashConfig(urls), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := crashRuntime(crashConsumer)
	cfg.StopWhenCaughtUp = true
	r, err := projector.New(e.js, n, cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil || ctx.Err() != nil {
		t.Fatalf("the notifier after the crash: %v %v", err, ctx.Err())
	}
	_ = n.Close()
	perEffect := rcv.check()
	if len(perEffect) != effects {
		t.Fatalf("%d distinct keys received, want one per effect: %d", len(perEffect), effects)
	}
	for key, c := range perEffect {
		if c < 1 || c > 2 {
			t.Errorf("effect %s: %d POSTs", key, c)
		}
	}
	return m
}

// newCrashEnv is a server holding two events and a receiver of two
// targets, at urls: four effects for a notifier child to crash on.
func newCrashEnv(t *testing.T) (*env, *receiver, []string) {
	t.Helper()
	e := newEnv(t)
	rcv := newReceiver(t)
	urls := []string{rcv.url("/a"), rcv.url("/b")}
	for _, ev := range []contract.Event{upsert("doc-1", 1), upsert("doc-2", 1)} {
		e.publish(ev, time.Now())
	}
	return e, rcv, urls
}

// Killed after the claim and before the send: the claim is taken over
// once stale, and the effect is sent once, with its key.
func TestSIGKILLBetweenClaimAndSend(t *testing.T) {
	e, rcv, urls := newCrashEnv(t)
	effect, seen := crashAt(t, e, rcv, "claimed", urls)
	if seen != 0 {
		t.Fatalf("the receiver saw %d requests of an effect claimed but not sent", seen)
	}
	if rec, err := e.record(effect); err != nil || rec.State != stateClaimed || rec.Owner != "child" {
		t.Fatalf("record at the kill: %+v %v", rec, err)
	}
	m := runAfterCrash(t, e, rcv, urls, 4)
	if got := rcv.check()[effect.String()]; got != 1 {
		t.Fatalf("the effect killed before its send got %d POSTs, want 1", got)
	}
	rec, err := e.record(effect)
	if err != nil || rec.State != stateSent || rec.Attempts != 2 {
		t.Fatalf("record after: %+v %v (want sent, the second attempt)", rec, err)
	}
	var takenOver float64
	for _, name := range targetNames(urls) {
		takenOver += testutil.ToFloat64(m.TakenOver.WithLabelValues(name))
	}
	if takenOver < 1 {
		t.Fatal("no claim was taken over")
	}
}

// Killed after the send and before the mark: the effect is sent again,
// with the same key, and the receiver can deduplicate it.
func TestSIGKILLBetweenSendAndMark(t *testing.T) {
	e, rcv, urls := newCrashEnv(t)
	effect, seen := crashAt(t, e, rcv, "sent", urls)
	if seen != 1 {
		t.Fatalf("the receiver saw %d requests of an effect sent but not marked, want 1", seen)
	}
	runAfterCrash(t, e, rcv, urls, 4)
	// check (in runAfterCrash) asserted that every request carried the key
	// derived from its URL and event: both POSTs of this effect carry its
	// one key.
	if got := rcv.check()[effect.String()]; got != 2 {
		t.Fatalf("the effect killed before its mark got %d POSTs, want 2 with one key", got)
	}
	if rec, err := e.record(effect); err != nil || rec.State != stateSent {
		t.Fatalf("record after: %+v %v", rec, err)
	}
}
