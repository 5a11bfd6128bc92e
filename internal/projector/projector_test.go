package projector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// memStore is a store kept in a map, with a version guard like every real
// store's, that fails on demand and checks the runtime's promises: one key
// at most once per call, and never two calls for one key at once.
type memStore struct {
	mu        sync.Mutex
	versions  map[string]int64
	busy      map[string]bool
	applied   int
	violation error
	// failing returns the error for an event, if any.
	failing func(ev *contract.Event) error
}

func newMemStore() *memStore {
	return &memStore{versions: map[string]int64{}, busy: map[string]bool{}}
}

func (s *memStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	seen := map[string]bool{}
	for _, ev := range events {
		if seen[ev.Key] || s.busy[ev.Key] {
			s.violation = fmt.Errorf("key %s twice in a call or in two calls at once", ev.Key)
		}
		seen[ev.Key], s.busy[ev.Key] = true, true
	}
	s.mu.Unlock()
	time.Sleep(time.Millisecond) // let concurrent calls overlap if the runtime allowed it
	s.mu.Lock()
	defer s.mu.Unlock()
	res := make([]projector.Result, len(events))
	for i, ev := range events {
		s.busy[ev.Key] = false
		if s.failing != nil {
			if err := s.failing(ev); err != nil {
				res[i].Err = err
				continue
			}
		}
		if s.versions[ev.Key] >= ev.Version {
			res[i].Outcome = projector.Skipped
			continue
		}
		s.versions[ev.Key] = ev.Version
		s.applied++
	}
	return res
}

func (s *memStore) version(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[key]
}

type env struct {
	js jetstream.JetStream
	nc *nats.Conn
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, testenv.StartNATS(t))
}

// newEnvOn is newEnv on the server n.
func newEnvOn(t *testing.T, n *testenv.NATS) *env {
	t.Helper()
	nc, js := n.DocsStream(t)
	return &env{js: js, nc: nc}
}

func (e *env) publish(t *testing.T, ev contract.Event) {
	t.Helper()
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	e.publishRaw(t, contract.Subject(ev.Key), data)
}

func (e *env) publishRaw(t *testing.T, subject string, data []byte) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func upsert(key string, version int64) contract.Event {
	d, err := contract.Document{Key: key, Version: version, Title: "t", Body: fmt.Sprintf("body of %s at %d", key, version)}.Normalize()
	if err != nil {
		panic(err)
	}
	return contract.NewUpsertedEvent(d, []string{d.Body})
}

// background runs r until the returned stop is called, or the test ends;
// stop reports an error of Run.
func background(t *testing.T, r *projector.Runtime) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func run(t *testing.T, e *env, store projector.Store, cfg projector.Config, metrics *projector.Metrics) {
	t.Helper()
	cfg.StopWhenCaughtUp = true
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	r, err := projector.New(e.js, store, cfg, metrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the projector did not catch up within 30s")
	}
}

func deadLetters(t *testing.T, e *env, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.js.Stream(context.Background(), deadletter.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(contract.DLQSubject(name)))
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			continue
		}
		if m.Subject == contract.DLQSubject(name) {
			out = append(out, m)
		}
	}
	return out
}

// Every document ends at its newest version, whatever the interleaving of
// versions in the stream, and superseded versions in a batch are counted.
func TestNewestVersionWins(t *testing.T) {
	e := newEnv(t)
	for v := int64(1); v <= 5; v++ {
		for k := range 50 {
			e.publish(t, upsert(fmt.Sprintf("doc-%d", k), v))
		}
	}
	// Late and repeated versions.
	for k := range 50 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 2))
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 5))
	}
	store := newMemStore()
	metrics := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{BatchSize: 64, Parallel: 4}, metrics)
	if store.violation != nil {
		t.Fatal(store.violation)
	}
	for k := range 50 {
		if v := store.version(fmt.Sprintf("doc-%d", k)); v != 5 {
			t.Fatalf("doc-%d at version %d, want 5", k, v)
		}
	}
	applied := testutil.ToFloat64(metrics.Events.WithLabelValues("applied"))
	skipped := testutil.ToFloat64(metrics.Events.WithLabelValues("skipped"))
	superseded := testutil.ToFloat64(metrics.Events.WithLabelValues("superseded"))
	if applied+skipped+superseded != 350 {
		t.Fatalf("applied %v + skipped %v + superseded %v != 350 messages", applied, skipped, superseded)
	}
	if superseded == 0 {
		t.Fatal("no version was superseded within a batch")
	}
	t.Logf("350 messages: %v applied, %v skipped, %v superseded", applied, skipped, superseded)
}

// A message that is not an event goes to converge.dlq.<name> with the
// reason, and the stream goes on.
func TestUndecodableMessageIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.publish(t, upsert("a", 1))
	e.publishRaw(t, contract.Subject("poison"), []byte(`{"schema":"converge.event.v1","kind":"nonsense"}`))
	ev := upsert("elsewhere", 1)
	data, _ := ev.Encode()
	e.publishRaw(t, contract.Subject("not-its-key"), data)
	e.publish(t, upsert("b", 1))
	store := newMemStore()
	metrics := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{Name: "idx"}, metrics)
	if store.version("a") != 1 || store.version("b") != 1 {
		t.Fatal("events around the poison were not applied")
	}
	dls := deadLetters(t, e, "idx")
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dls))
	}
	codes := map[string]bool{}
	for _, dl := range dls {
		codes[dl.Header.Get(deadletter.HeaderCode)] = true
		if dl.Header.Get(deadletter.HeaderReason) == "" || dl.Header.Get(deadletter.HeaderStream) != "CONVERGE_DOCS" || dl.Header.Get(deadletter.HeaderSeq) == "" {
			t.Fatalf("dead letter headers %v", dl.Header)
		}
	}
	if !codes["undecodable"] || !codes["wrong_subject"] {
		t.Fatalf("dead-letter codes %v", codes)
	}
	if n := testutil.ToFloat64(metrics.DeadLetters.WithLabelValues("undecodable")); n != 1 {
		t.Fatalf("dead-letter metric %v", n)
	}
}

// A store that rejects an event permanently gets it MaxDeliver times, then
// the event is dead-lettered; the others are applied meanwhile.
func TestPermanentRejectionIsDeadLetteredAfterMaxDeliver(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	attempts := 0
	store := newMemStore()
	store.failing = func(ev *contract.Event) error {
		if ev.Key != "bad" {
			return nil
		}
		mu.Lock()
		attempts++
		mu.Unlock()
		return projector.Permanent(errors.New("vector size mismatch"))
	}
	e.publish(t, upsert("good", 1))
	e.publish(t, upsert("bad", 1))
	e.publish(t, upsert("good2", 1))
	run(t, e, store, projector.Config{Name: "idx", MaxDeliver: 3, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}, nil)
	if store.version("good") != 1 || store.version("good2") != 1 || store.version("bad") != 0 {
		t.Fatal("wrong store state")
	}
	if attempts != 3 {
		t.Fatalf("bad was tried %d times, want MaxDeliver = 3", attempts)
	}
	dls := deadLetters(t, e, "idx")
	if len(dls) != 1 || dls[0].Header.Get(deadletter.HeaderCode) != "rejected" {
		t.Fatalf("dead letters: %d", len(dls))
	}
	if ev, err := contract.DecodeEvent(dls[0].Data); err != nil || ev.Key != "bad" {
		t.Fatalf("dead letter holds %v (%v)", ev.Key, err)
	}
}

// A transient error (the store is down) is retried in place until it
// clears; nothing is dead-lettered however long it lasts.
func TestTransientErrorsRetryInPlace(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	failures := 0
	store := newMemStore()
	store.failing = func(ev *contract.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if failures < 20 {
			failures++
			return errors.New("connection refused")
		}
		return nil
	}
	for k := range 10 {
		e.publish(t, upsert(fmt.Sprintf("d%d", k), 1))
	}
	metrics := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{MaxDeliver: 2, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond}, metrics)
	for k := range 10 {
		if store.version(fmt.Sprintf("d%d", k)) != 1 {
			t.Fatalf("d%d not applied", k)
		}
	}
	if testutil.ToFloat64(metrics.Retries) == 0 {
		t.Fatal("no retry counted")
	}
	if s, err := e.js.Stream(context.Background(), deadletter.Stream); err == nil {
		if info, _ := s.Info(context.Background()); info != nil && info.State.Msgs != 0 {
			t.Fatalf("%d dead letters for transient errors", info.State.Msgs)
		}
	}
}

// A second run of the same projector resumes after what was acknowledged;
// a runtime stopped mid-stream leaves nothing unapplied.
func TestResumesFromDurableConsumer(t *testing.T) {
	e := newEnv(t)
	for k := range 100 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	first := newMemStore()
	run(t, e, first, projector.Config{}, nil)
	for k := range 20 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 2))
	}
	second := newMemStore()
	run(t, e, second, projector.Config{}, nil)
	if second.applied != 20 {
		t.Fatalf("the second run applied %d events, want the 20 new ones", second.applied)
	}
	if first.applied != 100 {
		t.Fatalf("the first run applied %d events, want 100", first.applied)
	}
}

func TestConfigNeedsAName(t *testing.T) {
	_, err := projector.New(nil, newMemStore(), projector.Config{}, nil, nil)
	if err == nil {
		t.Fatal("a projector without a name was accepted")
	}
}

type classified struct{ permanent bool }

func (c classified) Error() string   { return "classified" }
func (c classified) Permanent() bool { return c.permanent }

func TestIsPermanent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("plain"), false},
		{projector.Permanent(errors.New("marked")), true},
		{fmt.Errorf("wrapped: %w", projector.Permanent(errors.New("marked"))), true},
		{fmt.Errorf("wrapped: %w", classified{true}), true},
		{fmt.Errorf("wrapped: %w", classified{false}), false},
		{nil, false},
	} {
		if got := projector.IsPermanent(c.err); got != c.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// publishRepair publishes ev as a re-emission: the relay's message id and
// re-emission header.
func (e *env) publishRepair(t *testing.T, ev contract.Event, emission int) {
	t.Helper()
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(contract.Subject(ev.Key))
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	m.Header.Set(contract.HeaderReemission, fmt.Sprint(emission))
	m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s.%d", ev.ID, emission))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// repairStore records, per key, how each version was written: in a plain
// call or in a repair call. Its guard is the stores': an older version is
// skipped, an equal one too unless the call is a repair.
type repairStore struct {
	mu       sync.Mutex
	versions map[string]int64
	writes   map[string][]string // key -> "v<version> plain|repair" per write
}

func (s *repairStore) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	repair := projector.IsRepair(ctx)
	res := make([]projector.Result, len(events))
	for i, ev := range events {
		stored, ok := s.versions[ev.Key]
		if ok && (stored > ev.Version || (stored == ev.Version && !repair)) {
			res[i].Outcome = projector.Skipped
			continue
		}
		s.versions[ev.Key] = ev.Version
		how := "plain"
		if repair {
			how = "repair"
		}
		s.writes[ev.Key] = append(s.writes[ev.Key], fmt.Sprintf("v%d %s", ev.Version, how))
	}
	return res
}

// A re-emitted message is a repair: it is applied in a store call marked
// with WithRepair, so the store writes the version it already holds again;
// the newest version of a document still wins, and at equal versions the
// repair does. Originals never go through a repair call.
func TestRepairsAreAppliedInMarkedCalls(t *testing.T) {
	e := newEnv(t)
	store := &repairStore{versions: map[string]int64{}, writes: map[string][]string{}}
	// Already projected before: a at v1, c at v3.
	e.publish(t, upsert("a", 1))
	e.publish(t, upsert("c", 3))
	run(t, e, store, projector.Config{Name: "repairs"}, nil)

	e.publish(t, upsert("a", 1))          // a redelivery: skipped
	e.publishRepair(t, upsert("a", 1), 1) // a repair of the same version: written again
	e.publish(t, upsert("b", 2))
	e.publishRepair(t, upsert("b", 1), 2) // a repair of an older version: never wins
	e.publishRepair(t, upsert("c", 3), 3) // a repair, then the original again
	e.publish(t, upsert("c", 3))
	e.publish(t, upsert("d", 1))
	metrics := projector.NewMetrics(nil)
	run(t, e, store, projector.Config{Name: "repairs", BatchSize: 64, Parallel: 2}, metrics)

	want := map[string][]string{
		"a": {"v1 plain", "v1 repair"},
		"b": {"v2 plain"},
		"c": {"v3 plain", "v3 repair"},
		"d": {"v1 plain"},
	}
	for key, w := range want {
		if got := store.writes[key]; fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s written as %v, want %v", key, got, w)
		}
	}
	// Every message was acknowledged: the consumer caught up (run returned),
	// and each is counted once.
	applied := testutil.ToFloat64(metrics.Events.WithLabelValues("applied"))
	skipped := testutil.ToFloat64(metrics.Events.WithLabelValues("skipped"))
	superseded := testutil.ToFloat64(metrics.Events.WithLabelValues("superseded"))
	if applied+skipped+superseded != 7 {
		t.Fatalf("applied %v + skipped %v + superseded %v != 7 messages", applied, skipped, superseded)
	}
}

func TestRepairContext(t *testing.T) {
	ctx := context.Background()
	if projector.IsRepair(ctx) {
		t.Fatal("a plain context is a repair")
	}
	rc := projector.WithRepair(ctx)
	type other struct{}
	if !projector.IsRepair(rc) || !projector.IsRepair(context.WithValue(rc, other{}, 1)) {
		t.Fatal("a repair context (or one derived from it) is not a repair")
	}
}

// A dead letter that cannot be stored (the dead-letter stream is gone)
// leaves the poison message for redelivery instead of losing it; once the
// stream is back, it is dead-lettered, once.
func TestDeadLetterPublishFailureRedelivers(t *testing.T) {
	e := newEnv(t)
	store := newMemStore()
	metrics := projector.NewMetrics(nil)
	r, err := projector.New(e.js, store, projector.Config{Name: "idx", RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond, MaxWait: 50 * time.Millisecond}, metrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer background(t, r)()
	<-r.Ready()
	if err := e.js.DeleteStream(context.Background(), deadletter.Stream); err != nil {
		t.Fatal(err)
	}
	e.publishRaw(t, contract.Subject("poison"), []byte("not an event"))
	e.publish(t, upsert("good", 1))
	testenv.Eventually(t, "the event after the poison to be applied while its dead letter cannot be stored", 10*time.Second,
		func() bool { return store.version("good") == 1 })
	// The poison (stream seq 1) delivered again and still not acknowledged:
	// its dead letter failed, was not counted, and left it for redelivery.
	// (Each failed publish takes a few hundred ms: the client retries when
	// no stream answers.)
	testenv.WaitConsumer(t, e.js, contract.DocsStream, "idx", "the poison to be redelivered", 10*time.Second,
		func(info *jetstream.ConsumerInfo) bool {
			return info.Delivered.Consumer >= 2+1 && info.AckFloor.Stream == 0
		})
	if n := testutil.ToFloat64(metrics.DeadLetters.WithLabelValues("undecodable")); n != 0 {
		t.Fatalf("%v dead letters counted while the dead-letter stream was missing", n)
	}
	if err := deadletter.EnsureStream(context.Background(), e.js, 1); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the poison to be dead-lettered once the stream is back", 10*time.Second,
		func() bool { return len(deadLetters(t, e, "idx")) > 0 })
	// Both messages acknowledged, none awaiting an ack: the poison cannot
	// be delivered, nor dead-lettered, again.
	testenv.WaitConsumer(t, e.js, contract.DocsStream, "idx", "both messages to be acknowledged", 10*time.Second,
		func(info *jetstream.ConsumerInfo) bool { return info.AckFloor.Stream >= 2 && info.NumAckPending == 0 })
	if n := len(deadLetters(t, e, "idx")); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
}
