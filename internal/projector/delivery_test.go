package projector_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// deliveryStore records what ApplyDeliveries receives, and answers with
// answer (nil: applied).
type deliveryStore struct {
	mu     sync.Mutex
	calls  [][]projector.Delivery
	answer func(d projector.Delivery) error
}

func (s *deliveryStore) Apply(context.Context, []*contract.Event) []projector.Result {
	panic("the runtime must call ApplyDeliveries on a DeliveryStore")
}

func (s *deliveryStore) ApplyDeliveries(_ context.Context, ds []projector.Delivery) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, ds)
	res := make([]projector.Result, len(ds))
	for i, d := range ds {
		if s.answer != nil {
			res[i].Err = s.answer(d)
		}
	}
	return res
}

func (s *deliveryStore) versions(key string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, call := range s.calls {
		for _, d := range call {
			if d.Event.Key == key {
				out = append(out, d.Event.Version)
			}
		}
	}
	return out
}

// With EveryEvent, every version of a document reaches the store, in
// stream order, and none is counted as superseded.
func TestEveryEventKeepsEveryVersion(t *testing.T) {
	e := newEnv(t)
	for v := int64(1); v <= 5; v++ {
		e.publish(t, upsert("a", v))
		e.publish(t, upsert("b", v))
	}
	store := &deliveryStore{}
	m := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{EveryEvent: true, BatchSize: 64, Parallel: 2}, m)
	for _, key := range []string{"a", "b"} {
		if got := store.versions(key); len(got) != 5 || got[0] != 1 || got[1] != 2 || got[2] != 3 || got[3] != 4 || got[4] != 5 {
			t.Errorf("versions of %s reaching the store: %v, want 1..5 in order", key, got)
		}
	}
	if n := testutil.ToFloat64(m.Events.WithLabelValues("superseded")); n != 0 {
		t.Errorf("%v superseded with EveryEvent", n)
	}
	if n := testutil.ToFloat64(m.Events.WithLabelValues("applied")); n != 10 {
		t.Errorf("%v applied, want 10", n)
	}
}

// A DeliveryStore learns each event's commit time, stream time and
// delivery count.
func TestDeliveryStoreSeesMessageDetails(t *testing.T) {
	e := newEnv(t)
	before := time.Now()
	e.publish(t, upsert("a", 1))
	store := &deliveryStore{}
	run(t, e, store, projector.Config{}, nil)
	if len(store.calls) != 1 || len(store.calls[0]) != 1 {
		t.Fatalf("calls: %v", store.calls)
	}
	d := store.calls[0][0]
	if d.Delivered != 1 || d.CommitTime.Before(before.Add(-time.Second)) || d.Stored.Before(before.Add(-time.Second)) {
		t.Fatalf("delivery %+v", d)
	}
}

// Redeliver naks the message with the store's delay, beyond MaxDeliver and
// without dead-lettering; the store sees the delivery count grow.
func TestRedeliverIsNotCappedByMaxDeliver(t *testing.T) {
	e := newEnv(t)
	e.publish(t, upsert("a", 1))
	store := &deliveryStore{answer: func(d projector.Delivery) error {
		if d.Delivered < 4 {
			return projector.Redeliver(errors.New("receiver busy"), 10*time.Millisecond)
		}
		return nil
	}}
	run(t, e, store, projector.Config{Name: "redeliver", MaxDeliver: 2, RetryMin: time.Hour, RetryMax: time.Hour}, nil)
	var delivered []uint64
	for _, call := range store.calls {
		delivered = append(delivered, call[0].Delivered)
	}
	if len(delivered) != 4 || delivered[3] != 4 {
		t.Fatalf("deliveries seen by the store: %v, want 1..4", delivered)
	}
	if dls := deadLetters(t, e, "redeliver"); len(dls) != 0 {
		t.Fatalf("%d dead letters", len(dls))
	}
}

// DeadLetter dead-letters the message at once, with the store's code and
// reason, and the stream goes on.
func TestDeadLetterErrorDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t)
	e.publish(t, upsert("bad", 1))
	e.publish(t, upsert("good", 1))
	store := &deliveryStore{answer: func(d projector.Delivery) error {
		if d.Event.Key == "bad" {
			return projector.DeadLetter("webhook_failed", errors.New("HTTP 500 after 3 attempts"))
		}
		return nil
	}}
	m := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{Name: "dl", MaxDeliver: 5}, m)
	if got := store.versions("bad"); len(got) != 1 {
		t.Fatalf("bad reached the store %d times, want once", len(got))
	}
	dls := deadLetters(t, e, "dl")
	if len(dls) != 1 || dls[0].Header.Get(deadletter.HeaderCode) != "webhook_failed" ||
		dls[0].Header.Get(deadletter.HeaderReason) != "HTTP 500 after 3 attempts" {
		t.Fatalf("dead letters: %d %v", len(dls), dls)
	}
	if n := testutil.ToFloat64(m.DeadLetters.WithLabelValues("webhook_failed")); n != 1 {
		t.Fatalf("dead letters counted: %v", n)
	}
}

func TestRedeliverAndDeadLetterKeepTheirCause(t *testing.T) {
	cause := errors.New("cause")
	if !errors.Is(projector.Redeliver(cause, time.Second), cause) || !errors.Is(projector.DeadLetter("x", cause), cause) {
		t.Fatal("the cause is lost")
	}
	if projector.Redeliver(nil, time.Second) != nil || projector.DeadLetter("x", nil) != nil {
		t.Fatal("a nil error must stay nil")
	}
	if projector.IsPermanent(projector.Redeliver(cause, 0)) {
		t.Fatal("Redeliver is not Permanent")
	}
}
