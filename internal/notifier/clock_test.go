package notifier

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// The tests of this file step a notifier's wall clock by an hour, forward
// or back, as an NTP step or a VM restored from a snapshot does, and
// check that claims and backoffs still take as long as they should.

// newClockedNotifier is a notifier on e's dedup store, reading the wall
// time from c.
func newClockedNotifier(t *testing.T, e *env, cfg Config, c clock.Clock, owner string) *Notifier {
	t.Helper()
	cfg.Clock, cfg.Owner = c, owner
	return e.newNotifier(cfg)
}

// redeliverAfter is the delay a result asks its event to be redelivered
// after; it fails the test for any other result.
func redeliverAfter(t *testing.T, res projector.Result, what string) time.Duration {
	t.Helper()
	var rd *projector.RedeliverError
	if !errors.As(res.Err, &rd) {
		t.Fatalf("%s: %+v; want a redelivery", what, res)
	}
	return rd.After
}

// A failed attempt's backoff is its recorded delay, however far the clock
// stepped back since: the retry is not held back by the step.
func TestBackoffEndsWhenTheClockStepsBack(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	rcv.answer = func(_ context.Context, _ request, n int) (int, string) {
		if n == 1 {
			return http.StatusServiceUnavailable, "down"
		}
		return http.StatusOK, "ok"
	}
	cfg := testConfig(rcv.url("/hook"))
	c := clock.NewShifted(0)
	n := newClockedNotifier(t, e, cfg, c, "a")
	ev := upsert("doc", 1)
	if after := redeliverAfter(t, n.Apply(context.Background(), []*contract.Event{&ev})[0], "the failed attempt"); after > cfg.RetryMax {
		t.Fatalf("backoff %v, beyond RetryMax %v", after, cfg.RetryMax)
	}
	c.Jump(-time.Hour)
	time.Sleep(cfg.RetryMax) // the longest backoff
	res := n.Apply(context.Background(), []*contract.Event{&ev})
	if res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("the retry after the backoff, the clock stepped back 1h: %+v; want it sent", res[0])
	}
	if got := rcv.count("/hook"); got != 2 {
		t.Fatalf("%d requests, want 2", got)
	}
}

// The claim of a process that died is taken over ClaimTimeout after it is
// first seen, by a notifier whose clock is an hour behind the dead one's.
func TestStaleClaimIsTakenOverWithAClockBehind(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	cfg := testConfig(rcv.url("/hook"))
	cfg.HTTPTimeout, cfg.ClaimTimeout = 500*time.Millisecond, time.Second
	n := newClockedNotifier(t, e, cfg, clock.NewShifted(-time.Hour), "behind")
	ev := upsert("doc", 1)
	// The dead process's claim, at its (right) time.
	j := &job{effect: contract.EffectID(n.targets[0].effect, ev.ID), target: n.targets[0], ev: &ev}
	dead := n.newRecord(j, stateClaimed, 1, time.Now().Round(0))
	dead.Owner = "dead"
	if _, err := n.kv.Create(context.Background(), j.effect.String(), dead.encode()); err != nil {
		t.Fatal(err)
	}
	after := redeliverAfter(t, n.Apply(context.Background(), []*contract.Event{&ev})[0], "a claim just seen")
	if after > cfg.ClaimTimeout {
		t.Fatalf("a claim just seen is to be looked at again after %v, beyond ClaimTimeout %v", after, cfg.ClaimTimeout)
	}
	if rcv.count("/hook") != 0 {
		t.Fatal("a claim just seen was taken over")
	}
	time.Sleep(after)
	res := n.Apply(context.Background(), []*contract.Event{&ev})
	if res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("ClaimTimeout after it was first seen, the clock 1h behind: %+v; want the claim taken over and sent", res[0])
	}
	if got := rcv.count("/hook"); got != 1 {
		t.Fatalf("%d requests, want 1", got)
	}
}

// A notifier whose clock is an hour ahead does not take over a live
// claim (another instance's send in flight): no second send.
func TestLiveClaimIsNotTakenOverWithAClockAhead(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	rcv.answer = func(ctx context.Context, _ request, n int) (int, string) {
		if n == 1 {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return http.StatusOK, "ok"
	}
	cfg := testConfig(rcv.url("/hook"))
	a := newClockedNotifier(t, e, cfg, clock.NewShifted(0), "a")
	b := newClockedNotifier(t, e, cfg, clock.NewShifted(time.Hour), "b")
	ev := upsert("doc", 1)
	done := make(chan projector.Result, 1)
	go func() { done <- a.Apply(context.Background(), []*contract.Event{&ev})[0] }()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("a's request did not arrive")
	}
	res := b.Apply(context.Background(), []*contract.Event{&ev})[0]
	redeliverAfter(t, res, "b, an hour ahead, finding a's claim")
	if !strings.Contains(res.Err.Error(), "claimed by a") {
		t.Fatalf("b's result %v; want the claim of a to wait for", res.Err)
	}
	close(release)
	<-done
	_ = a.Close() // a's send is over: answered, and marked sent

	if st, err := a.state(t, &ev); err != nil || st != stateSent {
		t.Fatalf("state %q (%v), want sent", st, err)
	}
	if got := rcv.count("/hook"); got != 1 {
		t.Fatalf("%d requests, want 1: the live claim was taken over", got)
	}
}
