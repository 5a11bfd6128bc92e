package lease

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/testenv"
)

func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func openLease(t *testing.T, js jetstream.JetStream, holder string, ttl time.Duration) *Lease {
	t.Helper()
	l, err := Open(context.Background(), js, Config{Name: "graph", Holder: holder, TTL: ttl}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type acquired struct {
	term *Term
	at   time.Time
	err  error
}

func acquireAsync(ctx context.Context, l *Lease, standby chan<- Value) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		t, err := l.Acquire(ctx, func(v Value) { standby <- v })
		out <- acquired{t, time.Now(), err}
	}()
	return out
}

// A holder that stops cleanly hands the lease to the standby at once.
func TestReleaseHandsOverAtOnce(t *testing.T) {
	js := jetStream(t)
	a, b := openLease(t, js, "a", 3*time.Second), openLease(t, js, "b", 3*time.Second)
	ta, err := a.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	standby := make(chan Value, 1)
	got := acquireAsync(context.Background(), b, standby)
	select {
	case v := <-standby:
		if v.Holder != "a" {
			t.Fatalf("b stands by behind %q, want a", v.Holder)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b never reported standing by")
	}
	// a keeps it for longer than a TTL: its renewals keep b out.
	select {
	case r := <-got:
		t.Fatalf("b took a renewed lease: %+v", r)
	case <-time.After(4 * time.Second):
	}
	if !ta.Valid() {
		t.Fatal("a's renewed term is not valid")
	}
	released := time.Now()
	ta.Release()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.term.Release()
	if took := r.at.Sub(released); took > time.Second {
		t.Fatalf("b took a released lease after %v, want under a second", took)
	}
	if r.term.Epoch() <= ta.Epoch() {
		t.Fatalf("b's epoch %d is not after a's %d", r.term.Epoch(), ta.Epoch())
	}
	if ta.Valid() {
		t.Fatal("a's released term is still valid")
	}
}

// A holder paused past its validity writes nothing: once the standby took
// over, the paused one's next renewal fails and its Check says ErrLost; the
// two terms never overlap in validity.
func TestPausedHolderIsFencedAfterTakeover(t *testing.T) {
	js := jetStream(t)
	const ttl = 1500 * time.Millisecond
	a, b := openLease(t, js, "a", ttl), openLease(t, js, "b", ttl)
	paused := make(chan struct{})
	resume := make(chan struct{})
	first := true
	a.beforeRenew = func() {
		if first {
			first = false
			close(paused)
			<-resume
		}
	}
	ta, err := a.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	<-paused
	pausedAt := time.Now()
	got := acquireAsync(context.Background(), b, make(chan Value, 1))
	var r acquired
	select {
	case r = <-got:
	case <-time.After(10 * ttl):
		t.Fatal("b never took over from a paused holder")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.term.Release()
	took := r.at.Sub(pausedAt)
	t.Logf("takeover %v after the holder's renewals stopped (TTL %v, validity %v)", took.Round(time.Millisecond), ttl, a.cfg.Validity())
	if took < a.cfg.Validity() {
		t.Fatalf("b took over %v after a's last renewal, before a's validity (%v) ran out", took, a.cfg.Validity())
	}
	if ta.Valid() {
		t.Fatal("a's term is valid while b holds the lease")
	}
	// a wakes: a write asks Check, which waits for a's renewal, which
	// finds b's revision.
	checked := make(chan error, 1)
	go func() { checked <- ta.Check(context.Background()) }()
	select {
	case err := <-checked:
		t.Fatalf("a's Check answered %v before its renewal ran", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(resume)
	select {
	case err := <-checked:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("a's Check after the takeover: %v, want ErrLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a's Check never answered")
	}
	if err := r.term.Check(context.Background()); err != nil {
		t.Fatalf("b's term: %v", err)
	}
	v, _, held, err := b.Current(context.Background())
	if err != nil || !held || v.Holder != "b" {
		t.Fatalf("the lease holds %+v (held %v, err %v), want b", v, held, err)
	}
}

// A holder whose renewals fail for a while (NATS restarting) but that
// nobody replaced keeps its term: Check waits, then lets it write again.
func TestHolderOutlivesAnOutageNobodyUsed(t *testing.T) {
	js := jetStream(t)
	const ttl = 900 * time.Millisecond
	a := openLease(t, js, "a", ttl)
	block := make(chan struct{})
	n := 0
	a.beforeRenew = func() {
		if n++; n == 1 {
			<-block
		}
	}
	ta, err := a.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Release()
	testenv.Eventually(t, "a's validity to run out", 5*time.Second, func() bool { return !ta.Valid() })
	checked := make(chan error, 1)
	go func() { checked <- ta.Check(context.Background()) }()
	close(block)
	select {
	case err := <-checked:
		if err != nil {
			t.Fatalf("Check after a renewal nobody contested: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Check never answered")
	}
}

// A restarted instance (the same Holder, another run) takes its lease at
// once instead of waiting out its dead run's TTL; that run, were it only
// paused, is fenced.
func TestRestartedInstanceTakesItsLeaseAtOnce(t *testing.T) {
	js := jetStream(t)
	const ttl = 3 * time.Second
	old := openLease(t, js, "host/127.0.0.1:9104", ttl)
	old.cfg.self.PID = deadPID(t) // the run a supervisor killed
	block := make(chan struct{})
	old.beforeRenew = func() { <-block }
	to, err := old.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	restarted := openLease(t, js, "host/127.0.0.1:9104", ttl)
	start := time.Now()
	tn, err := restarted.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Release()
	if took := time.Since(start); took > ttl/2 {
		t.Fatalf("the restarted run took its lease after %v, want at once (TTL %v)", took, ttl)
	}
	close(block)
	select {
	case <-to.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the earlier run never learnt its lease was taken")
	}
	if err := to.Check(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("the earlier run's Check: %v, want ErrLost", err)
	}
	// Another instance does wait.
	other := openLease(t, js, "host/127.0.0.1:9204", ttl)
	short, cancel := context.WithTimeout(context.Background(), ttl/2)
	defer cancel()
	if _, err := other.Acquire(short, nil); err == nil {
		t.Fatal("another instance took a renewed lease")
	}
}

// deadPID is the pid of a process that has ended.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// Two live instances under one name (pods with one fixed hostname, two
// processes given one metrics address) must not take the lease from each
// other: the second waits like any standby while the first renews.
func TestLiveInstancesOfOneNameDoNotAlternate(t *testing.T) {
	js := jetStream(t)
	const ttl = 900 * time.Millisecond
	a, b := openLease(t, js, "web-0/:9104", ttl), openLease(t, js, "web-0/:9104", ttl)
	ta, err := a.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 3*ttl)
	defer cancel()
	if tb, err := b.Acquire(ctx, nil); err == nil {
		tb.Release()
		t.Fatal("a second live instance of the same name took a renewed lease")
	}
	select {
	case <-ta.Lost():
		t.Fatal("the holder lost its lease to a live instance of its own name")
	default:
	}
	if !ta.Valid() {
		t.Fatal("the holder's term is not valid")
	}
}

// Only a process of this boot and pid namespace whose pid is free is
// proof that an earlier run ended.
func TestProcessGone(t *testing.T) {
	self := thisProcess()
	if self.Boot == "" || self.PIDNS == "" {
		t.Skip("no /proc/sys/kernel/random/boot_id or /proc/self/ns/pid here")
	}
	dead := deadPID(t)
	for _, c := range []struct {
		name string
		p    process
		gone bool
	}{
		{"ended", process{self.Boot, self.PIDNS, dead}, true},
		{"this process", self, false},
		{"alive", process{self.Boot, self.PIDNS, os.Getppid()}, false},
		{"another boot", process{"other-boot", self.PIDNS, dead}, false},
		{"another pid namespace", process{self.Boot, "pid:[1]", dead}, false},
		{"unknown", process{PID: dead}, false},
	} {
		if got := c.p.gone(self); got != c.gone {
			t.Errorf("%s: gone %v, want %v", c.name, got, c.gone)
		}
	}
}

// A call bound to a term ends when the term's validity runs out without a
// renewal (the holder cut off from NATS), and at once when it is lost.
func TestBoundCallEndsWithItsTerm(t *testing.T) {
	js := jetStream(t)
	const ttl = 900 * time.Millisecond
	l := openLease(t, js, "a", ttl)
	block := make(chan struct{})
	l.beforeRenew = func() { <-block }
	term, err := l.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bound, cancel := term.Bound(context.Background())
	defer cancel()
	select {
	case <-bound.Done():
	case <-time.After(3 * ttl):
		t.Fatal("a call bound to a term that renews nothing is still running after 3 TTLs")
	}
	if took := time.Since(start); took > l.cfg.Validity()+200*time.Millisecond {
		t.Errorf("the bound call ended %v after the term began, past its validity %v", took, l.cfg.Validity())
	}
	if !errors.Is(context.Cause(bound), ErrExpired) {
		t.Fatalf("cause %v, want ErrExpired", context.Cause(bound))
	}

	// Renewals again: the term is valid; a bound call lasts until the
	// lease is lost, then ends with ErrLost.
	close(block)
	if err := term.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	bound, cancel = term.Bound(context.Background())
	defer cancel()
	time.Sleep(2 * ttl)
	if bound.Err() != nil {
		t.Fatalf("a call bound to a renewed term ended: %v", context.Cause(bound))
	}
	term.markLost()
	select {
	case <-bound.Done():
	case <-time.After(time.Second):
		t.Fatal("a bound call outlived the term's loss")
	}
	if !errors.Is(context.Cause(bound), ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(bound))
	}
	term.Release()
}

// Steps of the holders' wall clocks move the times in the value, which
// are for people, and nothing else: a standby an hour behind the holder
// does not take a renewed lease, a holder whose clock steps back two hours
// keeps its term, and once its renewals stop the standby takes over
// within a TTL or so, as without steps.
func TestClockStepsMoveNoTerm(t *testing.T) {
	js := jetStream(t)
	const ttl = 900 * time.Millisecond
	open := func(holder string, c clock.Clock) *Lease {
		l, err := Open(context.Background(), js, Config{Name: "graph", Holder: holder, TTL: ttl, Clock: c}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ahead := clock.NewShifted(time.Hour)
	a, b := open("a", ahead), open("b", clock.NewShifted(-time.Hour))
	paused, resume := make(chan struct{}), make(chan struct{})
	pause := make(chan bool, 1)
	a.beforeRenew = func() {
		select {
		case <-pause:
			close(paused)
			<-resume
		default:
		}
	}
	defer close(resume)
	ta, err := a.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _, err := a.Current(context.Background()); err != nil || time.Until(v.Since) < 59*time.Minute || time.Until(v.Renewed) < 59*time.Minute {
		t.Fatalf("value %+v (%v), want the times of a clock an hour ahead", v, err)
	}
	ahead.Jump(-2 * time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 3*ttl)
	defer cancel()
	if tb, err := b.Acquire(ctx, nil); err == nil {
		tb.Release()
		t.Fatal("a standby an hour behind took a renewed lease")
	}
	if !ta.Valid() {
		t.Fatal("the holder's term is not valid after its clock stepped back")
	}
	if v, _, _, err := a.Current(context.Background()); err != nil || time.Until(v.Renewed) > -59*time.Minute {
		t.Fatalf("value %+v (%v), want renewals at the times of a clock an hour behind", v, err)
	}
	pause <- true
	<-paused
	pausedAt := time.Now()
	got := acquireAsync(context.Background(), b, make(chan Value, 1))
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.term.Release()
		if took := r.at.Sub(pausedAt); took < a.cfg.Validity() || took > 3*ttl {
			t.Fatalf("b took over %v after a's renewals stopped, want between %v and %v", took, a.cfg.Validity(), 3*ttl)
		}
	case <-time.After(10 * ttl):
		t.Fatal("b never took over from a holder whose renewals stopped")
	}
}
