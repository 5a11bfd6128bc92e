//go:build linux

package notifier

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
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
	"github.com/converge-sync/converge/pkg/contract"
)

// childEnv makes the test binary run a notifier that stops dead at the
// stage it names ("claimed": after the claim, before the send; "sent":
// after the send, before the mark), so that the test can SIGKILL it there.
const childEnv = "CONVERGE_NOTIFIER_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
	case effectsChild:
		os.Exit(runEffectsChild())
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
	cfg := crashConfig(strings.Split(os.Getenv(EnvWebhookURLs), ","))
	cfg.Owner = "child"
	n, err := New(context.Background(), js, cfg, nil, log)
	if err != nil {
		log.Error("notifier", "err", err)
		return 2
	}
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
	r, err := projector.New(js, n, crashRuntime(crashConsumer), nil, log)
	if err != nil {
		log.Error("projector", "err", err)
		return 2
	}
	if err := r.Run(context.Background()); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
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
	var logs bytes.Buffer
	var logsMu sync.Mutex
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+stage, "CONVERGE_NATS_URL="+e.n.URL, EnvWebhookURLs+"="+strings.Join(urls, ","))
	cmd.Stderr = writerFunc(func(b []byte) (int, error) { logsMu.Lock(); defer logsMu.Unlock(); return logs.Write(b) })
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			logsMu.Lock()
			t.Logf("child output:\n%s", logs.String())
			logsMu.Unlock()
		}
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatalf("the child never reached %q", stage)
	}
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
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return effect, seen
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

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

// Killed after the claim and before the send: the claim is taken over
// once stale, and the effect is sent once, with its key.
func TestSIGKILLBetweenClaimAndSend(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	urls := []string{rcv.url("/a"), rcv.url("/b")}
	for _, ev := range []contract.Event{upsert("doc-1", 1), upsert("doc-2", 1)} {
		e.publish(ev, time.Now())
	}
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
	e := newEnv(t)
	rcv := newReceiver(t)
	urls := []string{rcv.url("/a"), rcv.url("/b")}
	for _, ev := range []contract.Event{upsert("doc-1", 1), upsert("doc-2", 1)} {
		e.publish(ev, time.Now())
	}
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
