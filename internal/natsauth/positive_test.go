package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// Each test below runs a real component as its own user and checks that it
// does its job and that the server refused it nothing: where one fails, the
// permission set is wrong.

func TestRelayDoesItsJob(t *testing.T) {
	e := newEnv(t)
	r := e.connect(natsauth.UserRelay)
	e.record(natsauth.UserRelay)
	for range 2 { // creates, then finds it as it is
		if _, err := relay.EnsureStream(ctx(t), r.js, relay.StreamConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	ack := publishEvent(t, r.js, upsert(t, "doc-1", 1))
	if ack.Stream != contract.DocsStream || ack.Sequence != 1 {
		t.Errorf("ack %+v", ack)
	}
	// A catch-up reads the newest stored message.
	docs, err := r.js.Stream(ctx(t), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := docs.GetMsg(ctx(t), ack.Sequence); err != nil || m.Sequence != ack.Sequence {
		t.Fatalf("the relay reads the stream's last message: %v, %v", m, err)
	}
	// ... and a document's newest, to publish only what follows it.
	if m, err := docs.GetLastMsgForSubject(ctx(t), contract.Subject("doc-1")); err != nil || m.Sequence != ack.Sequence {
		t.Fatalf("the relay reads a document's newest message: %v, %v", m, err)
	}
	effects := relay.Config{Effects: relay.EffectsConfig{Enabled: true}}
	for range 2 { // creates, then finds it as it is
		if _, err := relay.EnsureEffectsStream(ctx(t), r.js, effects); err != nil {
			t.Fatal(err)
		}
	}
	ack = publishEventTo(t, r.js, contract.EventsSubject, upsert(t, "doc-1", 2))
	if ack.Stream != contract.EventsStream || ack.Sequence != 1 {
		t.Errorf("ack %+v", ack)
	}
	for i := range 2 { // creates, then updates
		pos, err := relay.OpenPositions(ctx(t), r.js, "converge_relay", 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := pos.Record(ctx(t), pglogrepl.LSN(0x1000+i)); err != nil {
			t.Fatal(err)
		}
		if rec, ok, err := pos.Read(ctx(t)); err != nil || !ok || rec.LSN != pglogrepl.LSN(0x1000+i).String() {
			t.Errorf("position record %+v, %v, %v", rec, ok, err)
		}
	}
	e.used(r)
	r.allowed(t)
}

// memStore applies events to a map, dead-lettering the keys it is told
// to.
type memStore struct {
	mu       sync.Mutex
	versions map[string]int64
	poison   map[string]bool
}

func (s *memStore) Apply(_ context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := make([]projector.Result, len(events))
	for i, ev := range events {
		switch {
		case s.poison[ev.Key]:
			res[i].Err = projector.DeadLetter("rejected", errors.New("the store rejects "+ev.Key))
		case s.versions[ev.Key] >= ev.Version:
			res[i].Outcome = projector.Skipped
		default:
			s.versions[ev.Key] = ev.Version
		}
	}
	return res
}

func (s *memStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.versions)
}

// A projector consumes with its durable consumer, acknowledges, and
// dead-letters both an undecodable message and an event its store rejects.
func TestProjectorDoesItsJob(t *testing.T) {
	for _, name := range []string{"index", "graph"} {
		t.Run(name, func(t *testing.T) { testProjectorDoesItsJob(t, name) })
	}
}

func testProjectorDoesItsJob(t *testing.T, name string) {
	e := newEnv(t)
	a := e.docsAsAdmin("doc-0", "doc-1", "doc-2", "poison")
	if _, err := a.js.Publish(context.Background(), "converge.docs.garbage", []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.ProjectorUser(name))
	e.record(p.user)
	store := &memStore{versions: map[string]int64{}, poison: map[string]bool{"poison": true}}
	runCaughtUp(t, p.js, store, projector.Config{Name: name, StopWhenCaughtUp: true}, "run")
	holdLease(t, p.js, contract.DocsStream, name)
	e.used(p)
	if n := store.len(); n != 3 {
		t.Errorf("applied %d documents, want 3", n)
	}
	c, err := a.js.Consumer(context.Background(), contract.DocsStream, name)
	if err != nil {
		t.Fatal(err)
	}
	if info := c.CachedInfo(); info.AckFloor.Stream != 5 || info.NumAckPending != 0 {
		t.Errorf("ack floor %d, %d pending acknowledgements; want 5, 0", info.AckFloor.Stream, info.NumAckPending)
	}
	q, err := deadletter.Open(context.Background(), a.js)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.Count(context.Background(), name); err != nil || n != 2 {
		t.Errorf("dead letters of %s: %d, %v; want 2", name, n, err)
	}
	p.allowed(t)
}

// holdLease does what a projector or the notifier does with its lease:
// opens the shared bucket (creating it, then as one that exists), takes its
// key, renews it, releases it, and resets its consumer as a new writer
// does.
func holdLease(t *testing.T, js jetstream.JetStream, stream, name string) {
	t.Helper()
	for range 2 {
		if _, err := lease.Open(ctx(t), js, lease.Config{Name: name, TTL: 600 * time.Millisecond}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.KeyValue(ctx(t), lease.Bucket); err != nil {
		t.Fatal(err)
	}
	l, err := lease.Open(ctx(t), js, lease.Config{Name: name, TTL: 600 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	term, err := l.Acquire(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A renewal: the key's revision moves on.
	_, taken, _, err := l.Current(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a renewal of lease "+name, 10*time.Second, func() bool {
		_, rev, _, err := l.Current(ctx(t))
		return err == nil && rev > taken
	})
	if err := term.Check(ctx(t)); err != nil {
		t.Fatal(err)
	}
	term.Release()
	if _, err := js.ResetConsumer(ctx(t), stream, name); err != nil {
		t.Fatalf("reset consumer %s: %v", name, err)
	}
}

// inPlaceStores is one generation, the live one, rebuilt in place.
type inPlaceStores struct{ store *memStore }

func (s *inPlaceStores) Live(context.Context) (string, error) { return "live", nil }
func (s *inPlaceStores) Open(_ context.Context, name string) (*rebuild.Generation, error) {
	return &rebuild.Generation{Name: name, Store: s.store}, nil
}
func (s *inPlaceStores) Describe(name string) string { return "memory " + name }
func (s *inPlaceStores) Wipe(context.Context, *rebuild.Generation) error {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	s.store.versions = map[string]int64{}
	return nil
}

// A projector's rebuild: its state in the rebuilds' bucket under its own
// key, its rebuild consumer created, consumed and deleted, dead letters of
// the rebuild, the stream's info read.
func TestProjectorRebuilds(t *testing.T) {
	for _, name := range []string{"index", "graph"} {
		t.Run(name, func(t *testing.T) { testProjectorRebuilds(t, name) })
	}
}

func testProjectorRebuilds(t *testing.T, name string) {
	e := newEnv(t)
	a := e.docsAsAdmin("doc-0", "doc-1", "doc-2", "doc-3", "doc-4", "poison")
	p := e.connect(natsauth.ProjectorUser(name))
	e.record(p.user)
	stores := &inPlaceStores{store: &memStore{versions: map[string]int64{}, poison: map[string]bool{"poison": true}}}
	proc := rebuildtest.Start(t, p.js, stores, projector.Config{Name: name})
	st := proc.StartRebuild(t)
	proc.WaitDone(t, st.ID, 30*time.Second)
	proc.Stop()

	// A rebuild a dead process left, with its consumer: resumed, with
	// what that process held delivered again at once (the consumer
	// reset).
	if _, err := a.js.CreateOrUpdateConsumer(ctx(t), contract.DocsStream, jetstream.ConsumerConfig{Durable: rebuild.ConsumerName(name),
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	rebuildtest.Leave(t, a.js, name, rebuild.State{ID: "left", Phase: rebuild.PhaseWiping, InPlace: true, Target: "db", Previous: "db", StartedAt: time.Now().UTC()})
	resumed := rebuildtest.Start(t, p.js, stores, projector.Config{Name: name})
	defer resumed.Stop()
	resumed.WaitDone(t, "left", 30*time.Second)
	e.used(p)
	if n := stores.store.len(); n != 5 {
		t.Errorf("the rebuilt store holds %d documents, want 5", n)
	}
	if _, err := a.js.Consumer(context.Background(), contract.DocsStream, rebuild.ConsumerName(name)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the rebuild consumer after the rebuild: %v", err)
	}
	q, err := deadletter.Open(context.Background(), a.js)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.Count(context.Background(), rebuild.ConsumerName(name)); err != nil || n != 1 {
		t.Errorf("dead letters of the rebuild: %d, %v; want 1", n, err)
	}
	p.allowed(t)
}

// wipePartitionStores are inPlaceStores whose partitions can be wiped
// one at a time.
type wipePartitionStores struct{ inPlaceStores }

func (s *wipePartitionStores) PartitionRefused(*rebuild.Generation) error { return nil }

func (s *wipePartitionStores) WipePartition(_ context.Context, _ *rebuild.Generation, part, n int) error {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	for key := range s.store.versions {
		if contract.Partition(key, n) == part {
			delete(s.store.versions, key)
		}
	}
	return nil
}

// A projector in partitions rebuilds one of them: its rebuild consumer on
// the partitioned stream, filtered to the partition, created, consumed,
// reset (a rebuild a dead process left), deleted; the partition's last
// message read; dead letters of the rebuild.
func TestPartitionedProjectorRebuildsAPartition(t *testing.T) {
	for _, name := range []string{"index", "graph"} {
		t.Run(name, func(t *testing.T) { testPartitionedProjectorRebuildsAPartition(t, name) })
	}
}

func testPartitionedProjectorRebuildsAPartition(t *testing.T, name string) {
	const parts, part = 2, 1
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := relay.ApplyPartsStream(ctx(t), a.js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	var mine, all []string
	poisoned := ""
	for i := 0; len(mine) < 4; i++ {
		key := fmt.Sprintf("doc-%d", i)
		publishEvent(t, a.js, upsert(t, key, 1))
		all = append(all, key)
		if contract.Partition(key, parts) == part {
			if poisoned == "" {
				poisoned = key
			}
			mine = append(mine, key)
		}
	}
	testenv.Eventually(t, "the partitioned stream to hold every event", 10*time.Second, func() bool {
		s, err := a.js.Stream(ctx(t), contract.PartsStream)
		return err == nil && s.CachedInfo().State.Msgs > 0 && s.CachedInfo().State.Msgs == lastSeqOf(t, a.js, contract.DocsStream)
	})
	p := e.connect(natsauth.ProjectorUser(name))
	e.record(p.user)
	stores := &wipePartitionStores{inPlaceStores{store: &memStore{versions: map[string]int64{}, poison: map[string]bool{poisoned: true}}}}
	// The live runtime is the one writer's; the manager knows the
	// partitions.
	mc := rebuild.Config{Runtime: projector.Config{Name: name}, Partitions: parts}
	proc := rebuildtest.StartWith(t, p.js, stores, mc)
	var st rebuild.Status
	testenv.Eventually(t, "the rebuild manager to be ready", 30*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = proc.Manager.StartPartition(ctx(t), part)
		if err != nil && proc.Manager.Status(ctx(t)).Phase == rebuild.PhaseStarting {
			return false
		}
		if err != nil || !started {
			t.Fatalf("start a rebuild of partition %d: started %v, %v", part, started, err)
		}
		return true
	})
	proc.WaitDone(t, st.ID, 30*time.Second)
	proc.Stop()

	// A rebuild of the partition a dead process left, with its consumer.
	if _, err := a.js.CreateOrUpdateConsumer(ctx(t), contract.PartsStream, jetstream.ConsumerConfig{Durable: rebuild.ConsumerName(name),
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.PartitionSubjectPrefix(part) + ">"}); err != nil {
		t.Fatal(err)
	}
	p1 := part
	rebuildtest.Leave(t, a.js, name, rebuild.State{ID: "left", Phase: rebuild.PhaseWiping, InPlace: true, Target: "live", Previous: "live",
		Partition: &p1, Partitions: parts, StartedAt: time.Now().UTC()})
	resumed := rebuildtest.StartWith(t, p.js, stores, mc)
	defer resumed.Stop()
	resumed.WaitDone(t, "left", 30*time.Second)
	e.used(p)
	if n := stores.store.len(); n != len(all)-1 {
		t.Errorf("the store holds %d documents, want %d (all but the poisoned one)", n, len(all)-1)
	}
	if _, err := a.js.Consumer(context.Background(), contract.PartsStream, rebuild.ConsumerName(name)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the rebuild consumer after the rebuild: %v", err)
	}
	p.allowed(t)
}

// lastSeqOf is stream's last sequence.
func lastSeqOf(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.LastSeq
}

// The notifier keeps its effects in its own bucket while it sends; it
// finishes and deletes its consumer of the documents' stream left by an
// older deployment, then consumes the effects' stream.
func TestNotifierDoesItsJob(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	// The older deployment: its consumer on the documents' stream has an
	// event and a poison message to deliver.
	if _, err := a.js.CreateOrUpdateConsumer(ctx(t), contract.DocsStream, jetstream.ConsumerConfig{Durable: natsauth.NotifierName,
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	publishEvent(t, a.js, upsert(t, "doc-1", 1))
	if _, err := a.js.Publish(context.Background(), "converge.docs.garbage", []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureEffectsStream(ctx(t), a.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	publishEventTo(t, a.js, contract.EventsSubject, upsert(t, "doc-2", 1))
	var hooks atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hooks.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	n := e.connect(natsauth.UserNotifier)
	e.record(natsauth.UserNotifier)
	nt, err := notifier.New(ctx(t), n.js, notifier.Config{URLs: []string{hook.URL}, Secret: []byte("secret")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nt.Close() }()
	rc := notifier.RuntimeConfig(projector.Config{Name: natsauth.NotifierName, StopWhenCaughtUp: true})
	info, err := notifier.WaitForStream(ctx(t), n.js, notifier.DefaultWindow, nil)
	if err != nil {
		t.Fatal(err)
	}
	if left, err := notifier.Migrate(ctx(t), n.js, nt, rc, info, slog.New(slog.DiscardHandler)); err != nil || left != 2 {
		t.Fatalf("move from the documents' stream: %d left, %v; want 2", left, err)
	}
	runCaughtUp(t, n.js, nt, rc, "run")
	holdLease(t, n.js, contract.EventsStream, rc.Name)
	if got := hooks.Load(); got != 2 {
		t.Errorf("%d webhook requests, want 2", got)
	}
	kv, err := a.js.KeyValue(context.Background(), natsauth.NotifierBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(context.Background())
	if err != nil || len(keys) != 2 {
		t.Errorf("effects recorded: %v, %v; want two", keys, err)
	}
	// It read the removals' stream (a refusal leaves no position).
	c, err := a.js.Consumer(context.Background(), contract.EventsStream, rc.Name)
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := projector.ReadGapRecord(c.CachedInfo().Config.Metadata); rec.RemovalsNext == 0 {
		t.Errorf("the notifier holds no position in %s: its record %+v", contract.RemovalsStream, rec)
	}
	// A start after a crash (no hand-over) reads the removal records
	// after its position: here one of another consumer's, passed over.
	cfg := c.CachedInfo().Config
	delete(cfg.Metadata, "converge.owed")
	if _, err := a.js.UpdateConsumer(context.Background(), contract.EventsStream, cfg); err != nil {
		t.Fatal(err)
	}
	record := `{"stream":"` + contract.EventsStream + `","consumer":"another","stream_seq":1,"reason":"Unacknowledged message was deleted"}`
	ack, err := a.js.Publish(context.Background(), contract.RemovalsSubject(contract.EventsStream, "another"), []byte(record))
	if err != nil {
		t.Fatal(err)
	}
	rt := runCaughtUp(t, n.js, nt, rc, "run after the crash")
	if rec := rt.LastGap(); rec.RemovalsNext != ack.Sequence+1 || rec.Missed != 0 {
		t.Errorf("after the removals' stream's record %d of another consumer: %+v, want the position past it and nothing missed", ack.Sequence, rec)
	}
	e.used(n)
	n.allowed(t)
}

// runCaughtUp runs store under a runtime with rc (which stops when caught
// up) on js, and fails the test, naming what, unless it caught up within
// 30 s.
func runCaughtUp(t *testing.T, js jetstream.JetStream, store projector.Store, rc projector.Config, what string) *projector.Runtime {
	t.Helper()
	rt, err := projector.New(js, store, rc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.Run(rctx); err != nil || rctx.Err() != nil {
		t.Fatalf("%s: %v, %v", what, err, rctx.Err())
	}
	return rt
}

// ingestStore stores documents in a map.
type ingestStore struct {
	writer.Store // the routes the ingest consumer does not call
	mu           sync.Mutex
	docs         map[string]int64
}

func (s *ingestStore) Apply(_ context.Context, writes []docstore.Write) ([]docstore.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]docstore.Outcome, len(writes))
	for i, w := range writes {
		s.docs[w.Doc.Key] = w.Doc.Version
		outs[i] = docstore.Outcome{Key: w.Doc.Key, Version: w.Doc.Version, Result: docstore.Applied}
	}
	return outs, nil
}

func (s *ingestStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.docs)
}

// The writer's ingest path: it ensures its streams, consumes what a
// producer published, acknowledges, and dead-letters what is malformed.
func TestWriterAndProducerDoTheirJob(t *testing.T) {
	e := newEnv(t)
	w := e.connect(natsauth.UserWriter)
	e.record(natsauth.UserWriter, natsauth.UserProducer)
	store := &ingestStore{docs: map[string]int64{}}
	in := writer.NewIngest(w.js, store, writer.IngestConfig{MaxWait: 50 * time.Millisecond}, nil, nil)
	if err := in.EnsureStreams(ctx(t)); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.UserProducer)
	for _, m := range []struct{ key, body string }{
		{"doc-1", `{"key":"doc-1","version":1,"title":"one"}`},
		{"doc-2", `{"key":"doc-2","version":1,"title":"two"}`},
		{"bad", `{"key":"bad","version":`},
	} {
		if _, err := p.js.Publish(ctx(t), contract.IngestSubject(m.key), []byte(m.body)); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(rctx) }()
	q := func() uint64 {
		q, err := deadletter.Open(context.Background(), e.connect(admin).js)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := q.Count(context.Background(), natsauth.IngestDLQName)
		return n
	}
	testenv.Eventually(t, "two documents and one dead letter", 30*time.Second, func() bool { return store.len() == 2 && q() == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.used(w, p)
	w.allowed(t)
	p.allowed(t)
}

// The operator's commands: status (streams, consumers, the message at an
// acknowledgement floor, dead letters, rebuilds in progress), replay, and
// dlq list, show and redrive of the ingest consumer's dead letters.
func TestOperatorDoesItsJob(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin("doc-1", "doc-2")
	bg := context.Background()
	if _, err := a.js.CreateOrUpdateConsumer(bg, contract.DocsStream, jetstream.ConsumerConfig{Durable: "index",
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	in := writer.NewIngest(a.js, &ingestStore{docs: map[string]int64{}}, writer.IngestConfig{}, nil, nil)
	if err := in.EnsureStreams(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := a.js.Publish(bg, contract.IngestSubject("doc-3"), []byte(`{"key":"doc-3","version":1}`)); err != nil {
		t.Fatal(err)
	}
	deadLetter(t, a, natsauth.IngestConsumer, natsauth.IngestDLQName, natsauth.IngestStream)
	if _, err := relay.EnsureEffectsStream(bg, a.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	kv, err := a.js.CreateOrUpdateKeyValue(bg, jetstream.KeyValueConfig{Bucket: natsauth.RebuildBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(bg, "graph", []byte(`{"projector":"graph","id":"r1","phase":"filling"}`)); err != nil {
		t.Fatal(err)
	}

	o := e.connect(natsauth.UserOperator)
	e.record(natsauth.UserOperator)
	// status
	for _, name := range []string{contract.DocsStream, contract.EventsStream, natsauth.IngestStream, deadletter.Stream} {
		s, err := o.js.Stream(ctx(t), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if name == deadletter.Stream {
			continue
		}
		lister := s.ListConsumers(ctx(t))
		for range lister.Info() {
		}
		if err := lister.Err(); err != nil {
			t.Fatalf("consumers of %s: %v", name, err)
		}
		if name == contract.EventsStream {
			continue // a work queue whose floor status does not read
		}
		// The ingest stream is a work queue: its acknowledged message is
		// gone, which the answer says.
		if _, err := s.GetMsg(ctx(t), 1); err != nil && (name != natsauth.IngestStream || !errors.Is(err, jetstream.ErrMsgNotFound)) {
			t.Errorf("message 1 of %s: %v", name, err)
		}
	}
	states, err := rebuild.InProgress(ctx(t), o.js)
	if err != nil || len(states) != 1 || states[0].ID != "r1" {
		t.Errorf("rebuilds in progress: %+v, %v", states, err)
	}
	// status: the relay's last catch-up, none here, then one.
	if _, ok, err := relay.ReadCatchUp(ctx(t), o.js, "converge_relay"); err != nil || ok {
		t.Errorf("catch-up record: %v, %v; want none", ok, err)
	}
	pos, err := a.js.CreateKeyValue(bg, jetstream.KeyValueConfig{Bucket: relay.PositionBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pos.Put(bg, relay.CatchUpKey("converge_relay"), []byte(`{"published":3}`)); err != nil {
		t.Fatal(err)
	}
	if cu, ok, err := relay.ReadCatchUp(ctx(t), o.js, "converge_relay"); err != nil || !ok || cu.Stored != 3 {
		t.Errorf("catch-up record: %+v, %v, %v; want 3 published", cu, ok, err)
	}
	// replay
	if pending, err := projector.Replay(ctx(t), o.js, contract.DocsStream, "index", projector.ReplayFrom{Seq: 2}); err != nil || pending != 1 {
		t.Errorf("replay from 2: %d pending, %v", pending, err)
	}
	// dlq list, show, redrive
	q, err := deadletter.Open(ctx(t), o.js)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := q.Summarize(ctx(t), deadletter.DefaultScanCap)
	if err != nil || len(sum.Consumers) != 1 {
		t.Fatalf("summary: %+v, %v", sum, err)
	}
	if _, err := q.Read(ctx(t), natsauth.IngestDLQName, 10); err != nil {
		t.Errorf("show: %v", err)
	}
	if n, err := q.Redrive(ctx(t), deadletter.Redrive{Consumer: natsauth.IngestDLQName, All: true}, nil); err != nil || n != 1 {
		t.Errorf("redrive: %d, %v", n, err)
	}
	e.used(o)
	o.allowed(t)
}

// The operator's converge streams apply on a new deployment creates the
// streams and the shared buckets, then, run again, updates them.
func TestOperatorAppliesStreams(t *testing.T) {
	e := newEnv(t)
	o := e.connect(natsauth.UserOperator)
	e.record(natsauth.UserOperator)
	for range 2 {
		if _, err := relay.ApplyStream(ctx(t), o.js, relay.StreamConfig{}); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.ApplyEffectsStream(ctx(t), o.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.ApplyPartsStream(ctx(t), o.js, relay.StreamConfig{}, 4, false); err != nil {
			t.Fatal(err)
		}
		if err := deadletter.ApplyStream(ctx(t), o.js, 1); err != nil {
			t.Fatal(err)
		}
		for _, b := range []sharedkv.Config{lease.BucketConfig(1), rebuild.BucketConfig(1)} {
			if err := sharedkv.Apply(ctx(t), o.js, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// -repartition: the partitioned stream made anew.
	if res, err := relay.ApplyPartsStream(ctx(t), o.js, relay.StreamConfig{}, 8, true); err != nil || res != relay.PartsRecreated {
		t.Fatalf("repartition: %v, %v", res, err)
	}
	e.used(o)
	o.allowed(t)
}
