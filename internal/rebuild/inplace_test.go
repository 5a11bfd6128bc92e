package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
// internal/graphprojector).
type recStore struct {
	mu       sync.Mutex
	versions map[string]int64
	wipes    int
	calls    int   // Apply calls so far
	wipedAt  int   // calls when the last wipe came
	lastFill int   // the last call of the rebuild runtime
	live     []int // the calls of the live runtime
}

func (s *recStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if ctx.Value(liveKey{}) != nil {
		s.live = append(s.live, s.calls)
	} else {
		s.lastFill = s.calls
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

// liveWritesDuringRebuild counts the live runtime's calls between the wipe
// and the rebuild runtime's last call.
func (s *recStore) liveWritesDuringRebuild() int {
	n := 0
	for _, c := range s.live {
		if c > s.wipedAt && c < s.lastFill {
			n++
		}
	}
	return n
}

type inPlaceStores struct{ store *recStore }

var _ InPlace = (*inPlaceStores)(nil)

func (f *inPlaceStores) Live(context.Context) (string, error) { return "db", nil }
func (f *inPlaceStores) Open(_ context.Context, name string) (*Generation, error) {
	return &Generation{Name: name, Store: f.store}, nil
}
func (f *inPlaceStores) Wipe(context.Context, *Generation) error {
	f.store.mu.Lock()
	defer f.store.mu.Unlock()
	f.store.versions = map[string]int64{}
	f.store.wipes++
	f.store.wipedAt = f.store.calls
	return nil
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
	if store.lastFill <= store.wipedAt {
		t.Errorf("the rebuild runtime made no call after the wipe (call %d); the last was call %d", store.wipedAt, store.lastFill)
	}
	if n := store.liveWritesDuringRebuild(); n != 0 {
		t.Errorf("the live runtime wrote %d times between the wipe and the rebuild runtime's last write; want 0 (one writer)", n)
	}
}

// bothStores are stores that claim both ways of rebuilding.
type bothStores struct{ *inPlaceStores }

func (bothStores) Fresh() string                          { return "fresh" }
func (bothStores) Activate(context.Context, string) error { return nil }
func (bothStores) Drop(context.Context, string) error     { return nil }

// neitherStores are stores with no way of rebuilding.
type neitherStores struct{ Stores }

// A manager rebuilds stores the one way they implement, and takes no
// stores that implement both ways or neither.
func TestNewManagerTakesStoresOfOneStrategy(t *testing.T) {
	in := &inPlaceStores{store: &recStore{versions: map[string]int64{}}}
	for _, tc := range []struct {
		name    string
		stores  Stores
		inPlace bool
		err     string
	}{
		{name: "in place", stores: in, inPlace: true},
		{name: "blue/green", stores: struct {
			BlueGreen
		}{bothStores{in}}},
		{name: "both", stores: bothStores{in}, err: "both blue/green and in place"},
		{name: "neither", stores: neitherStores{in}, err: "neither blue/green nor in place"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _ := in.Open(context.Background(), "db")
			m, err := NewManager(Config{Runtime: projector.Config{Name: "graph"}}, tc.stores, NewSwitch(g), nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewManager: %v; want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.status.InPlace; got != tc.inPlace {
				t.Fatalf("status in place %v; want %v", got, tc.inPlace)
			}
		})
	}
}

// A rebuild writes only while its instance holds the lease: with the
// fence refusing (the lease lost, or the term past its validity), the
// wipe never runs and the rebuild runtime writes nothing; once the fence
// lets writes through again, the rebuild goes on and finishes.
func TestRebuildWritesOnlyBehindTheFence(t *testing.T) {
	_, js := testenv.StartNATS(t).DocsStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 100 {
		d, err := contract.Document{Key: fmt.Sprintf("k%03d", i), Version: 1, Title: "t", Body: "b"}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		data, err := contract.NewUpsertedEvent(d, []string{d.Body}).Encode()
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(contract.Subject(d.Key))
		m.Data = data
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	store := &recStore{versions: map[string]int64{}}
	stores := &inPlaceStores{store: store}
	g, _ := stores.Open(ctx, "db")
	m, err := NewManager(Config{Runtime: projector.Config{Name: "graph", BatchSize: 50}, RetryMax: 100 * time.Millisecond}, stores, NewSwitch(g), nil)
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Bool // whether this instance's term is valid
	var refused atomic.Int32
	fence := projector.Fencing{Fence: func(context.Context) error {
		if !held.Load() {
			refused.Add(1)
			return errors.New("the lease is another instance's")
		}
		return nil
	}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = m.RunFenced(ctx, js, fence, nil) }()
	defer func() { cancel(); wg.Wait() }()
	testenv.Eventually(t, "the manager to take a rebuild", 30*time.Second, func() bool {
		_, _, err := m.Start(ctx)
		return err == nil
	})
	testenv.Eventually(t, "the fence to refuse the rebuild's writes", 30*time.Second, func() bool { return refused.Load() >= 2 })
	store.mu.Lock()
	wipes, calls := store.wipes, store.calls
	store.mu.Unlock()
	if wipes != 0 || calls != 0 {
		t.Fatalf("behind a refusing fence the rebuild wiped %d times and made %d store calls; want none", wipes, calls)
	}
	held.Store(true)
	testenv.Eventually(t, "the rebuild to finish once the fence lets it", 60*time.Second, func() bool { return m.Status(ctx).Phase == PhaseDone })
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.wipes != 1 || len(store.versions) != 100 {
		t.Fatalf("after the rebuild: %d wipes, %d documents; want 1 and 100", store.wipes, len(store.versions))
	}
}
