package rebuild_test

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

	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// sharedGens are the generations of one store that every instance of a
// partitioned projector writes, blue/green or in place, recording what no
// rebuild may let happen: a write to a generation after another was made
// live in its place (lost when it is dropped), a generation dropped while
// an instance still serves it (its reads would fail), and, in place, a
// write by another instance between the wipe and the rebuild's last
// write.
type sharedGens struct {
	inPlace bool
	mu      sync.Mutex
	gens    map[string]map[string]int64 // generation -> key -> version
	live    string
	retired map[string]bool   // once live, replaced since
	serving map[string]string // instance -> the generation it opened last
	n       int
	wrote   []write
	bad     []string
	// rebuilt are the keys the rebuild runtime wrote.
	rebuilt map[string]bool
	// rebuildDelay slows each batch of the rebuild runtime down: a
	// rebuild long enough to stop in the middle.
	rebuildDelay time.Duration
}

type write struct {
	instance, runtime string
}

func newSharedGens(inPlace bool) *sharedGens {
	return &sharedGens{inPlace: inPlace, gens: map[string]map[string]int64{"gen-0": {}}, live: "gen-0", retired: map[string]bool{}, serving: map[string]string{},
		rebuilt: map[string]bool{}}
}

func (s *sharedGens) apply(instance, gen string, ctx context.Context, events []*contract.Event) []projector.Result {
	if projector.RuntimeName(ctx) == rebuild.ConsumerName("index") && s.rebuildDelay > 0 {
		time.Sleep(s.rebuildDelay)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := projector.RuntimeName(ctx)
	out := make([]projector.Result, len(events))
	g, ok := s.gens[gen]
	if !ok {
		s.bad = append(s.bad, fmt.Sprintf("%s (%s) wrote %s, dropped", instance, rt, gen))
		for i := range out {
			out[i].Err = fmt.Errorf("generation %s was dropped", gen)
		}
		return out
	}
	if s.retired[gen] {
		s.bad = append(s.bad, fmt.Sprintf("%s (%s) wrote %d events to %s after another generation was made live", instance, rt, len(events), gen))
	}
	s.wrote = append(s.wrote, write{instance: instance, runtime: rt})
	for i, ev := range events {
		if rt == rebuild.ConsumerName("index") {
			s.rebuilt[ev.Key] = true
		}
		if g[ev.Key] >= ev.Version {
			out[i].Outcome = projector.Skipped
			continue
		}
		g[ev.Key] = ev.Version
	}
	return out
}

// liveVersions is what the live generation holds.
func (s *sharedGens) liveVersions() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.gens[s.live])
}

// violations are the writes no rebuild may let happen, in place (of the
// whole, or of one partition) any but the rebuild runtime's between the
// wipe and its last write: another instance's, or a live runtime's of the
// instance that rebuilds.
func (s *sharedGens) violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	bad := slices.Clone(s.bad)
	for start := 0; start < len(s.wrote); start++ {
		if s.wrote[start].runtime != "wipe" {
			continue
		}
		wiper, last := s.wrote[start].instance, start
		for i := start + 1; i < len(s.wrote); i++ {
			if s.wrote[i].runtime == "wipe" {
				break
			}
			if s.wrote[i].instance == wiper && s.wrote[i].runtime == rebuild.ConsumerName("index") {
				last = i
			}
		}
		for i := start + 1; i < last; i++ {
			if s.wrote[i].instance != wiper || s.wrote[i].runtime != rebuild.ConsumerName("index") {
				bad = append(bad, fmt.Sprintf("%s (%s) wrote while %s rebuilt in place", s.wrote[i].instance, s.wrote[i].runtime, wiper))
			}
		}
	}
	return bad
}

// gens is one instance's view of the shared generations: blue/green or
// in place as they were made.
type gens struct {
	s        *sharedGens
	instance string
}

type genStore struct {
	gens
	name string
}

func (g genStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	return g.s.apply(g.instance, g.name, ctx, events)
}

func (g gens) Live(context.Context) (string, error) {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return g.s.live, nil
}

func (g gens) Open(_ context.Context, name string) (*rebuild.Generation, error) {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	if g.s.gens[name] == nil && !g.s.retired[name] {
		g.s.gens[name] = map[string]int64{}
	}
	g.s.serving[g.instance] = name
	return &rebuild.Generation{Name: name, Store: genStore{gens: g, name: name}}, nil
}

func (g gens) Describe(name string) string { return "generation " + name }

type blueGreenGens struct{ gens }

func (g blueGreenGens) Fresh() string {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	g.s.n++
	return fmt.Sprintf("gen-%d", g.s.n)
}

func (g blueGreenGens) Activate(_ context.Context, name string) error {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	if g.s.live != name {
		g.s.retired[g.s.live] = true
	}
	g.s.live = name
	return nil
}

func (g blueGreenGens) Drop(_ context.Context, name string) error {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	for instance, gen := range g.s.serving {
		if gen == name {
			g.s.bad = append(g.s.bad, fmt.Sprintf("%s dropped %s while %s still served it", g.instance, name, instance))
		}
	}
	delete(g.s.gens, name)
	return nil
}

// WipePartition deletes the keys of partition part from gen, as a wipe.
func (g gens) WipePartition(_ context.Context, gen *rebuild.Generation, part, n int) error {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	for key := range g.s.gens[gen.Name] {
		if contract.Partition(key, n) == part {
			delete(g.s.gens[gen.Name], key)
		}
	}
	g.s.wrote = append(g.s.wrote, write{instance: g.instance, runtime: "wipe"})
	return nil
}

func (g gens) PartitionRefused(*rebuild.Generation) error { return nil }

// lose deletes keys from the live generation: a store that lost them.
func (s *sharedGens) lose(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.gens[s.live], k)
	}
}

// wipes counts the wipes, whole or of a partition.
func (s *sharedGens) wipes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.wrote {
		if w.runtime == "wipe" {
			n++
		}
	}
	return n
}

// haunt writes key at version into the live generation, past every
// writer: a document the store holds that no event made.
func (s *sharedGens) haunt(key string, version int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gens[s.live][key] = version
}

type inPlaceGens struct{ gens }

func (g inPlaceGens) Wipe(_ context.Context, gen *rebuild.Generation) error {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	g.s.gens[gen.Name] = map[string]int64{}
	g.s.wrote = append(g.s.wrote, write{instance: g.instance, runtime: "wipe"})
	return nil
}

// partInstance is one process of a partitioned projector, run in this one
// as rebuild.RunService runs it, its HTTP routes served at addr.
type partInstance struct {
	id, addr string
	cancel   context.CancelFunc
	done     chan error
}

func startPartInstance(t *testing.T, url, id string, parts int, s *sharedGens) *partInstance {
	t.Helper()
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.Name(id))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &partInstance{id: id, addr: addr, cancel: cancel, done: make(chan error, 1)}
	var stores rebuild.Stores = blueGreenGens{gens{s: s, instance: id}}
	if s.inPlace {
		stores = inPlaceGens{gens{s: s, instance: id}}
	}
	sc := projector.ServiceConfig{NATSURL: url, MetricsAddr: addr, Partitions: parts,
		Runtime: projector.Config{Name: "index", BatchSize: 32, LagInterval: 200 * time.Millisecond},
		Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond, Holder: id}}
	go func() {
		defer nc.Close()
		in.done <- rebuild.RunService(ctx, sc, stores, service.Deps{NATS: nc, Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
	}()
	t.Cleanup(in.stop)
	return in
}

func (in *partInstance) stop() {
	in.cancel()
	if err := <-in.done; err != nil {
		panic(fmt.Sprintf("instance %s: %v", in.id, err))
	}
	in.done <- nil
}

// A projector running in partitions on two instances is rebuilt, blue/
// green and in place, while events keep arriving: asked on the instance
// that does not coordinate the rebuilds, it is run by the one that does,
// which takes every partition while it writes alone. No event is written
// to a generation replaced by another (where it would be lost), nobody
// else writes while the store is rebuilt in place, the store ends with
// every event, and the instances share the partitions again, both writing
// the generation made live.
//
// Stopped while it rebuilds, the coordinator hands the rebuild over: the
// other instance takes the coordinator's lease and finishes it.
func TestPartitionedProjectorIsRebuilt(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		for _, stopped := range []bool{false, true} {
			name := map[bool]string{false: "blue-green", true: "in-place"}[inPlace] + map[bool]string{false: "", true: "-coordinator-stopped"}[stopped]
			t.Run(name, func(t *testing.T) { testPartitionedRebuild(t, inPlace, stopped) })
		}
	}
}

// partRig is two instances, a and b, of the partitioned projector
// "index" on one NATS server, sharing the generations s.
type partRig struct {
	t     *testing.T
	url   string
	js    jetstream.JetStream
	parts int
	s     *sharedGens
	a, b  *partInstance
}

// startPartRig starts NATS with the documents' and the partitioned
// stream, has publish write the documents there, and starts a and b.
func startPartRig(t *testing.T, parts int, s *sharedGens, publish func(jetstream.JetStream)) *partRig {
	t.Helper()
	n := testenv.StartNATS(t)
	_, js := n.DocsStream(t)
	if _, err := relay.ApplyPartsStream(context.Background(), js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	publish(js)
	r := &partRig{t: t, url: n.URL, js: js, parts: parts, s: s}
	r.a = startPartInstance(t, n.URL, "a", parts, s)
	r.b = startPartInstance(t, n.URL, "b", parts, s)
	return r
}

// holds waits until the live generation holds every key's last version
// in the documents' stream, but for except: a key there with version 0
// is missing, any other holds that version.
func (r *partRig) holds(what string, except map[string]int64) {
	r.t.Helper()
	testenv.Eventually(r.t, what, 60*time.Second, func() bool {
		want := rebuildtest.LastVersions(r.t, r.js)
		for k, v := range except {
			want[k] = v
			if v == 0 {
				delete(want, k)
			}
		}
		return maps.Equal(r.s.liveVersions(), want)
	})
}

// shared waits until a and b hold every partition, each some.
func (r *partRig) shared(what string) {
	r.t.Helper()
	testenv.Eventually(r.t, what, 30*time.Second, func() bool {
		by := map[string]int{}
		for p := range r.parts {
			by[projectortest.LeaseHolder(context.Background(), r.js, projector.PartitionLease("index", p))]++
		}
		return by["a"] > 0 && by["b"] > 0 && by["a"]+by["b"] == r.parts
	})
}

// coordinated returns the instance that coordinates the rebuilds, and the
// other.
func (r *partRig) coordinated() (coord, other *partInstance) {
	r.t.Helper()
	var holder string
	testenv.Eventually(r.t, "an instance to coordinate the rebuilds", 10*time.Second, func() bool {
		holder = projectortest.LeaseHolder(context.Background(), r.js, projector.CoordinatorLease("index"))
		return holder != ""
	})
	if holder == "a" {
		return r.a, r.b
	}
	return r.b, r.a
}

// stopMidRebuild stops coord once the rebuild other's client c reports is
// underWay, and waits for other to coordinate in its place; the test
// fails if nothing was left to apply when coord stopped.
func (r *partRig) stopMidRebuild(c *rebuild.Client, coord, other *partInstance, underWay func(rebuild.Status) bool) {
	r.t.Helper()
	var at rebuild.Status
	testenv.Eventually(r.t, "the rebuild to be under way", 30*time.Second, func() bool {
		var err error
		at, err = c.Status(context.Background())
		return err == nil && underWay(at)
	})
	coord.stop()
	if at.Phase == rebuild.PhaseDone || at.Pending == 0 {
		r.t.Fatalf("the rebuild was not under way when %s stopped: %+v", coord.id, at)
	}
	r.t.Logf("%s stopped while it rebuilt (partition %v): %s, applied %d, pending %d", coord.id, at.Partition, at.Phase, at.AppliedSeq, at.Pending)
	testenv.Eventually(r.t, other.id+" to coordinate", 10*time.Second, func() bool {
		return projectortest.LeaseHolder(context.Background(), r.js, projector.CoordinatorLease("index")) == other.id
	})
}

// restart starts the stopped instance in again.
func (r *partRig) restart(in *partInstance) {
	started := startPartInstance(r.t, r.url, in.id, r.parts, r.s)
	if in.id == "a" {
		r.a = started
	} else {
		r.b = started
	}
}

// wait waits for rebuild id on c to be done.
func wait(t *testing.T, c *rebuild.Client, id string) rebuild.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done, err := c.Wait(ctx, id, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	return done
}

// stop stops a and b and fails the test on any write no rebuild may let
// happen.
func (r *partRig) stop() {
	r.t.Helper()
	r.a.stop()
	r.b.stop()
	if bad := r.s.violations(); len(bad) > 0 {
		r.t.Fatalf("%d writes no rebuild may let happen, the first: %v", len(bad), bad[:min(5, len(bad))])
	}
}

func testPartitionedRebuild(t *testing.T, inPlace, stopCoordinator bool) {
	const parts = 4
	docs := 200
	if stopCoordinator {
		docs = 3000 // a rebuild long enough to stop in the middle
	}
	r := startPartRig(t, parts, newSharedGens(inPlace), func(js jetstream.JetStream) {
		for k := range docs {
			rebuildtest.Publish(t, js, fmt.Sprintf("doc-%03d", k), 1)
		}
	})
	s, js := r.s, r.js
	r.holds("a and b apply every event", nil)
	r.shared("a and b share the partitions")

	coord, other := r.coordinated()
	stop := rebuildtest.Traffic(t, js, docs, -1)
	defer stop()
	time.Sleep(300 * time.Millisecond)
	c := &rebuild.Client{Addr: other.addr}
	var st rebuild.Status
	testenv.Eventually(t, "a rebuild to start on "+other.id, 10*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = c.Start(context.Background())
		return err == nil && started
	})
	t.Logf("rebuild %s asked of %s, coordinated by %s", st.ID, other.id, coord.id)
	if stopCoordinator {
		r.stopMidRebuild(c, coord, other, func(at rebuild.Status) bool { return at.AppliedSeq > 0 })
	}
	done := wait(t, c, st.ID)
	if !inPlace && s.liveVersions() == nil {
		t.Fatal("no live generation")
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	s.mu.Lock()
	live := s.live
	s.mu.Unlock()
	if !inPlace && live == "gen-0" {
		t.Fatalf("rebuild %s done (%+v), but gen-0 is still live", st.ID, done)
	}
	r.holds("the rebuilt store holds every event", nil)
	if stopCoordinator {
		r.restart(coord)
	}
	r.shared("a and b share the partitions again after the rebuild")
	for k := range docs {
		rebuildtest.Publish(t, js, fmt.Sprintf("doc-%03d", k), 1_000_000)
	}
	r.holds("both instances write the live generation after the rebuild", nil)
	r.stop()
	t.Logf("live generation %s", live)
}

// One partition of a projector running in partitions on two instances is
// rebuilt, with the store blue/green and in place, while events keep
// arriving: asked on the instance that does not coordinate the rebuilds,
// it is run by the one that does, on the live generation, from the
// partition's events alone. A document of that partition the store lost
// is back and one no event made is gone; one of another partition the
// store lost is still missing and one no event made still there (nothing
// else was touched); no other generation was made; nobody else
// wrote between the wipe and the rebuild's last write; and the instances
// share the partitions again afterwards.
//
// Stopped while it rebuilds the partition, the coordinator hands the
// rebuild over: the other instance takes the coordinator's lease and
// finishes it, with the same outcome.
func TestOnePartitionIsRebuilt(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		for _, stopped := range []bool{false, true} {
			name := map[bool]string{false: "blue-green", true: "in-place"}[inPlace] + map[bool]string{false: "", true: "-coordinator-stopped"}[stopped]
			t.Run(name, func(t *testing.T) { testOnePartitionRebuilt(t, inPlace, stopped) })
		}
	}
}

func testOnePartitionRebuilt(t *testing.T, inPlace, stopCoordinator bool) {
	const parts, part, docs = 4, 2, 200
	// A document in the partition rebuilt, and one in another, that the
	// store will lose; live traffic does not write them.
	var lostHere, lostElsewhere string
	for i := 0; lostHere == "" || lostElsewhere == ""; i++ {
		key := fmt.Sprintf("kept-%d", i)
		switch p := contract.Partition(key, parts); {
		case p == part && lostHere == "":
			lostHere = key
		case p != part && lostElsewhere == "":
			lostElsewhere = key
		}
	}
	s := newSharedGens(inPlace)
	if stopCoordinator {
		// About 50 of the partition's events a second: seconds to
		// stop the coordinator in.
		s.rebuildDelay = 20 * time.Millisecond
	}
	r := startPartRig(t, parts, s, func(js jetstream.JetStream) {
		for k := range docs {
			rebuildtest.Publish(t, js, fmt.Sprintf("doc-%03d", k), 1)
		}
		rebuildtest.Publish(t, js, lostHere, 1)
		rebuildtest.Publish(t, js, lostElsewhere, 1)
	})
	js := r.js
	r.holds("a and b apply every event", nil)
	r.shared("a and b share the partitions")
	s.lose(lostHere, lostElsewhere)
	ghostHere, ghostElsewhere := "ghost-"+lostHere, "ghost-"+lostElsewhere
	for contract.Partition(ghostHere, parts) != part {
		ghostHere += "x"
	}
	for contract.Partition(ghostElsewhere, parts) == part {
		ghostElsewhere += "x"
	}
	s.haunt(ghostHere, 99)
	s.haunt(ghostElsewhere, 99)

	coord, other := r.coordinated()
	stop := rebuildtest.Traffic(t, js, docs, -1)
	defer stop()
	time.Sleep(300 * time.Millisecond)
	c := &rebuild.Client{Addr: other.addr}
	if _, _, err := c.StartPartition(context.Background(), parts); err == nil {
		t.Fatalf("a rebuild of partition %d of %d started", parts, parts)
	} else if ae, ok := errors.AsType[*rebuild.APIError](err); !ok || ae.Code != "invalid_partition" {
		t.Fatalf("a rebuild of partition %d of %d: %v, want invalid_partition", parts, parts, err)
	}
	var st rebuild.Status
	testenv.Eventually(t, "a rebuild of partition 2 to start on "+other.id, 10*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = c.StartPartition(context.Background(), part)
		return err == nil && started
	})
	if st.Partition == nil || *st.Partition != part || st.Partitions != parts || !st.InPlace {
		t.Fatalf("the rebuild started: %+v, want partition %d of %d, in place", st, part, parts)
	}
	if stopCoordinator {
		r.stopMidRebuild(c, coord, other, func(at rebuild.Status) bool { return at.Phase == rebuild.PhaseFilling && at.AppliedSeq > 0 })
	}
	done := wait(t, c, st.ID)
	time.Sleep(300 * time.Millisecond)
	stop()
	r.holds("the store holds every event, and of another partition the lost document missing and the ghost there",
		map[string]int64{lostElsewhere: 0, ghostElsewhere: 99})
	s.mu.Lock()
	live, fresh := s.live, s.n
	var others []string
	for key := range s.rebuilt {
		if contract.Partition(key, parts) != part {
			others = append(others, key)
		}
	}
	rebuilt := len(s.rebuilt)
	s.mu.Unlock()
	if live != "gen-0" || fresh != 0 {
		t.Errorf("a rebuild of one partition made generation %s live (%d fresh ones named)", live, fresh)
	}
	if len(others) > 0 {
		t.Errorf("the rebuild of partition %d wrote %d documents of other partitions, such as %s", part, len(others), others[0])
	}
	if rebuilt == 0 {
		t.Error("the rebuild runtime wrote nothing")
	}
	if stopCoordinator {
		r.restart(coord)
	}
	r.shared("a and b share the partitions again after the rebuild")
	r.stop()
	t.Logf("rebuild %s of partition %d (%+v): %d documents rewritten", st.ID, part, done, rebuilt)
}
