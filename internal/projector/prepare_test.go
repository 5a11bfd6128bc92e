package projector_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// preparingStore is a memStore that records, in order, each Prepare and
// each Apply (the keys of its events), and whether a Prepare overlapped
// an Apply.
type preparingStore struct {
	*memStore
	mu       sync.Mutex
	calls    []string
	applying int
	overlap  bool
	prepared map[string]bool
}

func (s *preparingStore) Prepare(_ context.Context, events []*contract.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applying > 0 {
		s.overlap = true
	}
	for _, ev := range events {
		s.prepared[fmt.Sprintf("%s@%d", ev.Key, ev.Version)] = true
	}
	s.calls = append(s.calls, fmt.Sprintf("prepare %d", len(events)))
}

func (s *preparingStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	s.applying++
	for _, ev := range events {
		if !s.prepared[fmt.Sprintf("%s@%d", ev.Key, ev.Version)] {
			s.calls = append(s.calls, "applied unprepared "+ev.Key)
		}
	}
	s.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // a store write, during which the next batch is prepared
	res := s.memStore.Apply(ctx, events)
	s.mu.Lock()
	s.applying--
	s.mu.Unlock()
	return res
}

// A store that prepares (projector.Preparer) is given every batch's events
// before their Apply, in the fetcher: while the batch before is being
// applied.
func TestPreparerSeesEachBatchBeforeItsApply(t *testing.T) {
	e := newEnv(t)
	for i := range 600 {
		e.publish(t, upsert(fmt.Sprintf("doc-%03d", i), 1))
	}
	s := &preparingStore{memStore: newMemStore(), prepared: map[string]bool{}}
	run(t, e, s, projector.Config{BatchSize: 50, Parallel: 2}, nil)
	prepares := 0
	for _, c := range s.calls {
		if c[:7] == "applied" {
			t.Fatalf("%s (calls %v)", c, s.calls)
		}
		prepares++
	}
	if s.memStore.applied != 600 || prepares < 12 {
		t.Fatalf("%d applied, %d prepares; want 600 applied, a prepare per batch of 50", s.memStore.applied, prepares)
	}
	if !s.overlap {
		t.Error("no Prepare ran while a batch was applied: it is not one batch ahead")
	}
}
