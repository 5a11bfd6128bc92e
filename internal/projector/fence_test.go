package projector_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// An instance whose lease is gone writes nothing more and acknowledges
// nothing more: once Fence refuses, the batch in hand is neither applied
// nor acknowledged, Run ends with a FencedError, and the next writer gets
// every event the fenced one did not apply.
func TestFencedRuntimeWritesAndAcknowledgesNothing(t *testing.T) {
	e := newEnv(t)
	for k := range 300 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	lost := errors.New("the lease is another instance's")
	var calls atomic.Int32
	fenced := newMemStore()
	metrics := projector.NewMetrics(nil)
	r, err := projector.New(e.js, fenced, projector.Config{Name: "fenced", BatchSize: 100, Parallel: 1,
		Fence: func(context.Context) error {
			if calls.Add(1) > 1 { // the first batch is written, then the lease is lost
				return lost
			}
			return nil
		}}, metrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var fe *projector.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, lost) {
		t.Fatalf("Run ended with %v, want a FencedError wrapping the refusal", err)
	}
	if fenced.applied == 0 || fenced.applied > 100 {
		t.Fatalf("the fenced instance applied %d events, want those of its one batch before the refusal", fenced.applied)
	}
	if n := testutil.ToFloat64(metrics.Fenced); n == 0 {
		t.Error("no event counted fenced")
	}
	// The next writer (the same consumer) gets exactly what the fenced one
	// did not apply: it acknowledged its applied batch, and nothing else.
	// Taking the lease, it resets the consumer, as RunService does: what
	// the fenced one held comes back at once, not after the ack wait.
	// (Its acknowledgements are on their way: the server takes them
	// asynchronously, so the reset waits for them, as a takeover a lease
	// period later does.)
	testenv.Eventually(t, "the fenced instance's acknowledgements to be taken", 10*time.Second, func() bool {
		c, err := e.js.Consumer(context.Background(), contract.DocsStream, "fenced")
		return err == nil && c.CachedInfo().AckFloor.Stream >= uint64(fenced.applied)
	})
	if _, err := e.js.ResetConsumer(context.Background(), contract.DocsStream, "fenced"); err != nil {
		t.Fatal(err)
	}
	next := newMemStore()
	run(t, e, next, projector.Config{Name: "fenced"}, nil)
	if fenced.applied+next.applied != 300 {
		t.Fatalf("the fenced instance applied %d, the next writer %d: want 300 together, each event once", fenced.applied, next.applied)
	}
}

// stuckStore's calls last until their context ends, as a store call of a
// writer cut off from NATS may: only the term's bound stops them.
type stuckStore struct{ calls atomic.Int32 }

func (s *stuckStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.calls.Add(1)
	<-ctx.Done()
	res := make([]projector.Result, len(events))
	for i := range res {
		res[i].Outcome = projector.Applied // what a store that ignores its context might report
	}
	return res
}

// A store call cannot outlast the term it started in: when the term's
// validity runs out mid-call (the writer cut off from NATS), the call's
// context ends, nothing of it is acknowledged, Run ends with a
// FencedError naming the expiry, and the next writer gets every event.
func TestStoreCallEndsWithItsTerm(t *testing.T) {
	e := newEnv(t)
	for k := range 50 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	stuck := &stuckStore{}
	expired := errors.New("the term's validity ran out")
	r, err := projector.New(e.js, stuck, projector.Config{Name: "bound", BatchSize: 100, Parallel: 1,
		Bound: func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancelCause(ctx)
			time.AfterFunc(300*time.Millisecond, func() { cancel(expired) })
			return ctx, func() { cancel(context.Canceled) }
		}}, projector.NewMetrics(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var fe *projector.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, expired) {
		t.Fatalf("Run ended with %v, want a FencedError wrapping the expiry", err)
	}
	if stuck.calls.Load() != 1 {
		t.Fatalf("%d store calls, want the one cut off", stuck.calls.Load())
	}
	if _, err := e.js.ResetConsumer(context.Background(), contract.DocsStream, "bound"); err != nil {
		t.Fatal(err)
	}
	next := newMemStore()
	run(t, e, next, projector.Config{Name: "bound"}, nil)
	if next.applied != 50 {
		t.Fatalf("the next writer applied %d events, want all 50: the cut-off call acknowledged some", next.applied)
	}
}

// A write beside the runtime that succeeded is done even if the term
// ended meanwhile (an alias switch that landed must not be taken for one
// that did not); one that failed once the term ended is fenced.
func TestFencingDoReportsWhatLanded(t *testing.T) {
	expired := errors.New("the term's validity ran out")
	f := projector.Fencing{Bound: func(ctx context.Context) (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancelCause(ctx)
		cancel(expired)
		return ctx, func() {}
	}}
	if err := f.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatalf("a write that returned nil: %v, want nil", err)
	}
	var fe *projector.FencedError
	if err := f.Do(context.Background(), func(ctx context.Context) error { return ctx.Err() }); !errors.As(err, &fe) || !errors.Is(err, expired) {
		t.Fatalf("a write cut off by the term's end: %v, want a FencedError of the expiry", err)
	}
}
