package rebuild

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

type liveKey struct{}

// recStore is a projection with the store's freshness guard, recording
// who writes when, so that the test can tell which runtime wrote during
// the rebuild (the rebuild in place of a real Neo4j is tested in
// internal/graph/backends).
type recStore struct {
	mu         sync.Mutex
	versions   map[string]int64
	wipes      int
	rebuilding bool // from the wipe to the activation
	liveWrites int  // writes of the live runtime while rebuilding
}

func (s *recStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Value(liveKey{}) != nil && s.rebuilding {
		s.liveWrites++
	}
	out := make([]projector.Result, len(events))
	for i, ev := range events {
		if s.versions[ev.Key] >= ev.Version {
			out[i].Outcome = projector.Skipped
			continue
		}
		s.versions[ev.Key] = ev.Version
	}
	return out
}

type inPlaceStores struct{ store *recStore }

func (f *inPlaceStores) Live(context.Context) (string, error) { return "db", nil }
func (f *inPlaceStores) Open(_ context.Context, name string) (*Generation, error) {
	return &Generation{Name: name, Store: f.store}, nil
}
func (f *inPlaceStores) Fresh() string { return "" }
func (f *inPlaceStores) InPlace() bool { return true }
func (f *inPlaceStores) Wipe(context.Context, *Generation) error {
	f.store.mu.Lock()
	defer f.store.mu.Unlock()
	f.store.versions = map[string]int64{}
	f.store.wipes++
	f.store.rebuilding = true
	return nil
}
func (f *inPlaceStores) Activate(context.Context, string) error {
	f.store.mu.Lock()
	defer f.store.mu.Unlock()
	f.store.rebuilding = false
	return nil
}
func (f *inPlaceStores) Drop(context.Context, string) error {
	return fmt.Errorf("an in-place store is never dropped")
}
func (f *inPlaceStores) Describe(name string) string { return "test store " + name }

// An in-place rebuild wipes the store and fills it from the stream's start
// with the live runtime held back throughout, then lets it go on; events
// published during the rebuild all arrive.
func TestInPlaceRebuild(t *testing.T) {
	_, js := testenv.StartNATS(t).DocsStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	publish := func(key string, version int64) {
		d, err := contract.Document{Key: key, Version: version, Title: "t", Body: "b"}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		data, err := contract.NewUpsertedEvent(d, []string{d.Body}).Encode()
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(contract.Subject(key))
		m.Data = data
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Error(err)
		}
	}
	for i := range 2000 {
		publish(fmt.Sprintf("k%04d", i), 1)
	}
	store := &recStore{versions: map[string]int64{}}
	stores := &inPlaceStores{store: store}
	g, _ := stores.Open(ctx, "db")
	sw := NewSwitch(g)
	cfg := projector.Config{Name: "graph", BatchSize: 50}
	m, err := NewManager(Config{Runtime: cfg}, stores, sw, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := projector.New(js, sw, cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = rt.Run(context.WithValue(ctx, liveKey{}, true)) }()
	go func() { defer wg.Done(); _ = m.Run(ctx, js) }()
	defer func() { cancel(); wg.Wait() }()
	count := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.versions)
	}
	testenv.Eventually(t, "the live runtime to apply 2000 documents", 60*time.Second, func() bool { return count() == 2000 })

	var st Status
	testenv.Eventually(t, "the manager to take a rebuild", 60*time.Second, func() bool {
		var err error
		st, _, err = m.Start(ctx)
		return err == nil
	})
	if !st.InPlace || st.Phase != PhaseWiping || st.Target != "db" {
		t.Fatalf("status at the start: %+v", st)
	}
	for i := range 200 { // live traffic during the rebuild
		publish(fmt.Sprintf("k%04d", i), 2)
	}
	testenv.Eventually(t, "the rebuild to finish", 60*time.Second, func() bool { return m.Status(ctx).Phase == PhaseDone })
	for i := range 200 {
		publish(fmt.Sprintf("new%04d", i), 1)
	}
	testenv.Eventually(t, "every document at its last version", 60*time.Second, func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		if len(store.versions) != 2200 {
			return false
		}
		for i := range 200 {
			if store.versions[fmt.Sprintf("k%04d", i)] != 2 {
				return false
			}
		}
		return true
	})
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.wipes != 1 {
		t.Errorf("%d wipes; want 1", store.wipes)
	}
	if store.liveWrites != 0 {
		t.Errorf("the live runtime wrote %d times between the wipe and the end of the rebuild; want 0 (one writer)", store.liveWrites)
	}
}
