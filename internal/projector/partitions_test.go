package projector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// sharedStore is one store written by several instances, each through
// its own instanceStore: it records which instance writes each partition
// at every moment, and a write of a partition while another instance's
// write of it is in progress is a violation.
type sharedStore struct {
	*memStore
	parts   int
	mu      sync.Mutex
	writing map[int]map[string]int // partition -> instance -> calls in progress
	wrote   map[int]map[string]bool
	events  map[string]int // instance -> events it was handed
	bad     error
}

type instanceStore struct {
	s  *sharedStore
	id string
}

func (i instanceStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s := i.s
	parts := map[int]bool{}
	for _, ev := range events {
		parts[contract.Partition(ev.Key, s.parts)] = true
	}
	s.mu.Lock()
	for p := range parts {
		for other, n := range s.writing[p] {
			if other != i.id && n > 0 && s.bad == nil {
				s.bad = fmt.Errorf("partition %d written by %s and %s at once", p, other, i.id)
			}
		}
		if s.writing[p] == nil {
			s.writing[p], s.wrote[p] = map[string]int{}, map[string]bool{}
		}
		s.writing[p][i.id]++
		s.wrote[p][i.id] = true
	}
	if s.events == nil {
		s.events = map[string]int{}
	}
	s.events[i.id] += len(events)
	s.mu.Unlock()
	res := s.memStore.Apply(ctx, events)
	s.mu.Lock()
	for p := range parts {
		s.writing[p][i.id]--
	}
	s.mu.Unlock()
	return res
}

// instance is one process of a partitioned projector, run in this one.
type instance struct {
	id     string
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

// standby is the instance's converge_projector_standby of partition p.
func (in *instance) standby(t *testing.T, p int) float64 {
	t.Helper()
	mfs, err := in.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "converge_projector_standby" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projector" && l.GetValue() == contract.PartitionName("index", p) {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("instance %s has no converge_projector_standby of partition %d", in.id, p)
	return -1
}

func startInstance(t *testing.T, url, id string, parts int, store *sharedStore) *instance {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(id))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{id: id, cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	sc := projector.ServiceConfig{NATSURL: url, Partitions: parts,
		Runtime: projector.Config{Name: "index", BatchSize: 32, LagInterval: 200 * time.Millisecond},
		Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond, Holder: id}}
	go func() {
		defer nc.Close()
		in.done <- projector.RunService(ctx, sc, instanceStore{s: store, id: id}, nil,
			service.Deps{NATS: nc, Registry: in.reg, Log: slog.New(slog.DiscardHandler)})
	}()
	t.Cleanup(in.stop)
	return in
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
	in.done <- nil // a second stop returns at once
}

// holders reads who holds each partition's lease.
func holders(t *testing.T, js jetstream.JetStream, parts int) map[int]string {
	t.Helper()
	got := map[int]string{}
	for p := range parts {
		if h := projectortest.LeaseHolder(context.Background(), js, projector.PartitionLease("index", p)); h != "" {
			got[p] = h
		}
	}
	return got
}

// TestPartitionsAreSharedAndHandedOver: instances of one projector share
// its partitions, each written by one instance at a time: one instance
// takes them all, a second one joining takes its share (handed over after
// the batch in hand), one leaving hands its share back, and every event
// reaches the store whatever the moves.
func TestPartitionsAreSharedAndHandedOver(t *testing.T) {
	const parts, keys = 4, 300
	n := testenv.StartNATS(t)
	e := newEnvOn(t, n)
	if _, err := relay.ApplyPartsStream(context.Background(), e.js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	store := &sharedStore{memStore: newMemStore(), parts: parts, writing: map[int]map[string]int{}, wrote: map[int]map[string]bool{}}
	version := int64(0)
	publishAll := func() {
		version++
		for k := range keys {
			e.publish(t, upsert(fmt.Sprintf("doc-%d", k), version))
		}
	}
	converged := func(what string) {
		t.Helper()
		testenv.Eventually(t, what, 30*time.Second, func() bool {
			for k := range keys {
				if store.version(fmt.Sprintf("doc-%d", k)) != version {
					return false
				}
			}
			return true
		})
	}
	split := func(what string, want ...string) map[int]string {
		t.Helper()
		var got map[int]string
		testenv.Eventually(t, what, 20*time.Second, func() bool {
			got = holders(t, e.js, parts)
			if len(got) != parts {
				return false
			}
			by := map[string]int{}
			for _, h := range got {
				by[h]++
			}
			for _, id := range want {
				if by[id] == 0 {
					return false
				}
			}
			return len(by) == len(want)
		})
		return got
	}

	publishAll()
	a := startInstance(t, n.URL, "a", parts, store)
	converged("instance a alone applies every event")
	t.Logf("a alone: %v", split("a holds every partition", "a"))

	b := startInstance(t, n.URL, "b", parts, store)
	got := split("a and b share the partitions", "a", "b")
	t.Logf("a and b: %v", got)
	var leases []string
	for p := range parts {
		leases = append(leases, projector.PartitionLease("index", p))
	}
	want := lease.Assign([]string{lease.MemberID("a"), lease.MemberID("b")}, leases)
	// Both hold partitions while the last hand-over may still be under
	// way: the split settles on the assignment's.
	testenv.Eventually(t, "a and b to hold the assignment's split", 20*time.Second, func() bool {
		got = holders(t, e.js, parts)
		for p := range parts {
			if lease.MemberID(got[p]) != want[projector.PartitionLease("index", p)] {
				return false
			}
		}
		return true
	})
	publishAll()
	converged("a and b apply every event")
	for p, h := range got {
		for _, in := range []*instance{a, b} {
			want := 0.0
			if in.id != h {
				want = 1
			}
			if v := in.standby(t, p); v != want {
				t.Errorf("instance %s: converge_projector_standby of partition %d (held by %s) is %v, want %v", in.id, p, h, v, want)
			}
		}
	}

	publishAll()
	began := time.Now()
	b.stop()
	split("a holds every partition again once b stopped", "a")
	t.Logf("b's partitions taken back by a within %v of its stop", time.Since(began).Round(time.Millisecond))
	converged("every event applied after b left")

	c := startInstance(t, n.URL, "c", parts, store)
	publishAll()
	split("a and c share the partitions", "a", "c")
	converged("a and c apply every event")
	c.stop()
	a.stop()

	store.mu.Lock()
	defer store.mu.Unlock()
	if store.bad != nil {
		t.Fatal(store.bad)
	}
	if store.violation != nil {
		t.Fatal(store.violation)
	}
	writers := map[int][]string{}
	for p, w := range store.wrote {
		writers[p] = slices.Sorted(maps.Keys(w))
	}
	t.Logf("instances that wrote each partition: %v", writers)
}

// The move of a running projector to partitions: the one writer of
// before, still running when the partitions' instance starts, stops
// writing first; the partitions start where it stopped (they are not
// handed what it applied again); and an instance started without
// partitions afterwards refuses to start, naming the number.
func TestTheOneWriterStopsWhenPartitionsBegin(t *testing.T) {
	const parts, keys = 2, 200
	n := testenv.StartNATS(t)
	e := newEnvOn(t, n)
	store := &sharedStore{memStore: newMemStore(), parts: parts, writing: map[int]map[string]int{}, wrote: map[int]map[string]bool{}}
	for k := range keys {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	one := startInstance(t, n.URL, "one", 0, store)
	testenv.Eventually(t, "the one writer applies every event", 20*time.Second, func() bool {
		return store.version(fmt.Sprintf("doc-%d", keys-1)) == 1
	})
	if _, err := relay.ApplyPartsStream(context.Background(), e.js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	p := startInstance(t, n.URL, "p", parts, store)
	select {
	case err := <-one.done:
		if !errors.Is(err, projector.ErrPartitioned) {
			t.Fatalf("the one writer ended with %v, want ErrPartitioned", err)
		}
		one.done <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("the one writer still runs 20s after the partitions' instance started")
	}
	for k := range keys {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 2))
	}
	testenv.Eventually(t, "the partitions apply every event", 20*time.Second, func() bool {
		for k := range keys {
			if store.version(fmt.Sprintf("doc-%d", k)) != 2 {
				return false
			}
		}
		return true
	})
	store.mu.Lock()
	handed := store.events["p"]
	store.mu.Unlock()
	if handed > keys+keys/4 {
		t.Errorf("the partitions were handed %d events: the %d of version 2 and %d the one writer had applied already", handed, keys, handed-keys)
	}
	t.Logf("the partitions were handed %d events for %d new versions", handed, keys)
	again := startInstance(t, n.URL, "again", 0, store)
	select {
	case err := <-again.done:
		if !errors.Is(err, projector.ErrPartitioned) {
			t.Fatalf("an instance without partitions ended with %v, want ErrPartitioned", err)
		}
		again.done <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("an instance without partitions runs beside the partitions")
	}
	p.stop()
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.bad != nil {
		t.Fatal(store.bad)
	}
}

// A runtime stopped while it starts (a partition handed over at once)
// ends without an error: an error ends the instance's process.
func TestRunStoppedWhileStartingIsNoError(t *testing.T) {
	e := newEnv(t)
	r, err := projector.New(e.js, newMemStore(), projector.Config{Name: "index-p00"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run stopped before it started: %v", err)
	}
}

// An instance without a configured holder name or a metrics address
// announces itself under the leases' default name (host and pid), not
// under an empty one that every such instance would share.
func TestMemberWithoutAHolderNameIsNamed(t *testing.T) {
	n := testenv.StartNATS(t)
	e := newEnvOn(t, n)
	if _, err := relay.ApplyPartsStream(context.Background(), e.js, relay.StreamConfig{}, 2, false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	sc := projector.ServiceConfig{NATSURL: n.URL, Partitions: 2, Runtime: projector.Config{Name: "index"},
		Lease: projector.LeaseConfig{TTL: 600 * time.Millisecond}}
	go func() {
		done <- projector.RunService(ctx, sc, newMemStore(), nil, service.Deps{NATS: e.nc, Log: slog.New(slog.DiscardHandler)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var keys []string
	testenv.Eventually(t, "the instance to announce itself", 20*time.Second, func() bool {
		kv, err := e.js.KeyValue(context.Background(), lease.Bucket)
		if err != nil {
			return false
		}
		lister, err := kv.ListKeysFiltered(context.Background(), "index.members.*")
		if err != nil {
			return false
		}
		keys = keys[:0]
		for k := range lister.Keys() {
			keys = append(keys, k)
		}
		return len(keys) == 1
	})
	if keys[0] == "index.members."+lease.MemberID("") {
		t.Fatalf("the instance announced itself under the empty holder name's id: %s", keys[0])
	}
}
