package projector_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// forgettingStore records the runtimes told to forget what they
// prepared.
type forgettingStore struct {
	*memStore
	mu     sync.Mutex
	forgot []string
}

func (f *forgettingStore) Prepare(context.Context, []*contract.Event) {}

func (f *forgettingStore) Forget(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, projector.RuntimeName(ctx))
}

// A runtime that stops has its store forget what it prepared for it,
// naming itself: a partition handed over leaves nothing prepared behind.
func TestStoppedRuntimeIsForgotten(t *testing.T) {
	e := newEnv(t)
	store := &forgettingStore{memStore: newMemStore()}
	r, err := projector.New(e.js, store, projector.Config{Name: "index-p03"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, upsert("doc", 1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.Eventually(t, "the event applied", 10*time.Second, func() bool { return store.version("doc") == 1 })
	store.mu.Lock()
	early := slices.Clone(store.forgot)
	store.mu.Unlock()
	if len(early) != 0 {
		t.Fatalf("forgotten while running: %v", early)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if !slices.Equal(store.forgot, []string{"index-p03"}) {
		t.Fatalf("forgotten: %v, want the runtime index-p03 once", store.forgot)
	}
}
