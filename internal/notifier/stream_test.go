package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// newRelayedEnv is a NATS server with the streams as the relay makes them:
// the documents' stream keeping history versions of each document, and the
// effects' stream bounded by maxBytes (-1: unbounded).
func newRelayedEnv(t *testing.T, history, maxBytes int64) *env {
	t.Helper()
	e := newBareEnv(t)
	cfg := relay.Config{Stream: relay.StreamConfig{MaxMsgsPerSubject: history},
		Effects: relay.EffectsConfig{Enabled: true, MaxBytes: maxBytes}}
	if _, err := relay.EnsureStream(context.Background(), e.js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	e.effectsStream(cfg)
	return e
}

// newBareEnv is a NATS server without any stream.
func newBareEnv(t *testing.T) *env {
	t.Helper()
	n := testenv.StartNATS(t)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, n: n, nc: nc, js: js}
}

// effectsStream creates (or updates) the effects' stream as the relay does.
func (e *env) effectsStream(cfg relay.Config) {
	e.t.Helper()
	if _, err := relay.EnsureEffectsStream(context.Background(), e.js, cfg); err != nil {
		e.t.Fatal(err)
	}
}

// relayPublish stores ev as the relay does: on its subject of the
// documents' stream and, when effects is true, of the effects' stream,
// with the event id as Nats-Msg-Id.
func (e *env) relayPublish(ev contract.Event, effects bool) {
	e.t.Helper()
	data, err := ev.Encode()
	if err != nil {
		e.t.Fatal(err)
	}
	subjects := []string{contract.Subject(ev.Key)}
	if effects {
		subjects = append(subjects, contract.EventsSubject(ev.Key))
	}
	for _, subject := range subjects {
		m := nats.NewMsg(subject)
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, ev.ID.String())
		m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			e.t.Fatal(err)
		}
	}
}

// runRuntime runs store with rc (made a test's: caught up, then stopped)
// and returns the runtime's metrics.
func (e *env) runRuntime(rc projector.Config, store projector.Store) *projector.Metrics {
	e.t.Helper()
	rc.StopWhenCaughtUp, rc.BatchSize, rc.AckWait = true, 16, 5*time.Second
	rc.RetryMin, rc.RetryMax = 10*time.Millisecond, 100*time.Millisecond
	m := projector.NewMetrics(nil, rc.Name)
	r, err := projector.New(e.js, store, rc, m, discardLogger())
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil || ctx.Err() != nil {
		e.t.Fatalf("run %s: %v, %v", rc.Name, err, ctx.Err())
	}
	return m
}

// The notifier, on the effects' stream, is sent every version of every
// document even when it reads them long after the documents' stream has
// dropped all but the last two of each: the 44% of versions never
// notified. The same events read from the documents' stream, as the
// notifier did before, lose exactly what the history drops, and say so.
func TestNotifierSeesEveryVersionTheHistoryDrops(t *testing.T) {
	e := newRelayedEnv(t, 2, -1)
	// The old way, for contrast: a notifier on the documents' stream, whose
	// consumer exists before the events, as a deployed one does.
	old := newReceiver(t)
	on := e.newNotifier(testConfig(old.url("/hook")))
	docsRuntime := projector.Config{Name: "docs-notifier", EveryEvent: true}
	e.runRuntime(docsRuntime, on)

	const keys, versions = 25, 8
	for v := int64(1); v <= versions; v++ {
		for k := range keys {
			e.relayPublish(upsert(fmt.Sprintf("doc-%02d", k), v), true)
		}
	}
	if n := e.streamState(contract.DocsStream).Msgs; n != keys*2 {
		t.Fatalf("the documents' stream holds %d messages, want its history of 2 per document: %d", n, keys*2)
	}
	if n := e.streamState(contract.EventsStream).Msgs; n != keys*versions {
		t.Fatalf("the effects' stream holds %d messages, want every event: %d", n, keys*versions)
	}

	rcv := newReceiver(t)
	cfg := testConfig(rcv.url("/hook"))
	n := e.newNotifier(cfg)
	m := e.runRuntime(RuntimeConfig(projector.Config{Name: "notifier"}), n)
	perEffect := rcv.check()
	if len(perEffect) != keys*versions {
		t.Fatalf("%d effects notified, want every version: %d", len(perEffect), keys*versions)
	}
	for key, c := range perEffect {
		if c != 1 {
			t.Errorf("effect %s: %d POSTs", key, c)
		}
	}
	if missed := testutil.ToFloat64(m.Missed); missed != 0 {
		t.Fatalf("%v events reported missed on the effects' stream", missed)
	}
	// A work queue: what the notifier acknowledged has left the stream.
	testenv.Eventually(t, "the effects' stream to be empty", 5*time.Second, func() bool {
		return e.streamState(contract.EventsStream).Msgs == 0
	})

	om := e.runRuntime(docsRuntime, on)
	if got := len(old.check()); got != keys*2 {
		t.Fatalf("on the documents' stream: %d effects, want the %d the history keeps", got, keys*2)
	}
	if missed := testutil.ToFloat64(om.Missed); missed != keys*(versions-2) {
		t.Fatalf("on the documents' stream: %v reported missed, want %d", missed, keys*(versions-2))
	}
}

// The effects' stream keeps an event until the notifier handled it, within
// its size bound: when a notifier that is down lets it fill, the oldest
// events leave, and the notifier reports each one it never received, by
// count and range; nothing is dropped silently.
func TestEventsTheEffectsStreamDropsAreReported(t *testing.T) {
	const bound = 64 << 10
	e := newRelayedEnv(t, 4, bound)
	rcv := newReceiver(t)
	cfg := testConfig(rcv.url("/hook"))
	n := e.newNotifier(cfg)
	rc := RuntimeConfig(projector.Config{Name: "notifier"})
	e.relayPublish(upsert("first", 1), true)
	e.runRuntime(rc, n) // the consumer exists, then the notifier is down

	const published = 400
	for i := range published {
		e.relayPublish(upsert(fmt.Sprintf("doc-%03d", i), 1), true)
	}
	kept := e.streamState(contract.EventsStream).Msgs
	if kept == 0 || kept >= published {
		t.Fatalf("the effects' stream holds %d of %d events: its bound of %d bytes should have dropped some", kept, published, bound)
	}
	m := e.runRuntime(rc, n)
	if missed := testutil.ToFloat64(m.Missed); missed != float64(published-kept) {
		t.Fatalf("%v events reported missed, want the %d the bound dropped", missed, published-kept)
	}
	if got := len(rcv.check()); got != 1+int(kept) {
		t.Fatalf("%d effects notified, want the first and the %d kept", got, kept)
	}
	rec, ok := e.gapRecord(contract.EventsStream, "notifier")
	if !ok || rec.Missed != published-kept || rec.LastFrom != 2 || rec.LastTo != 1+published-kept {
		t.Fatalf("gap record %+v (found %v), want %d missed, sequences 2..%d", rec, ok, published-kept, 1+published-kept)
	}
}

// An existing deployment moves without losing or repeating a
// notification: its notifier consumed the documents' stream and had not
// read everything yet when the relay, upgraded, created the effects'
// stream. The new notifier first finishes its old consumer up to where the
// effects' stream began, deletes it, then consumes the effects' stream;
// the events in both are sent once.
func TestMigrationFinishesTheOldConsumerThenMoves(t *testing.T) {
	e := newBareEnv(t)
	js := e.js
	cfg := relay.Config{Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}, Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.EnsureStream(context.Background(), js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t)
	ncfg := testConfig(rcv.url("/hook"))
	nt := e.newNotifier(ncfg)

	// Before: the old relay publishes to the documents' stream alone, and
	// the old notifier has notified the first 10 events of 30.
	for i := range 10 {
		e.relayPublish(upsert(fmt.Sprintf("doc-%02d", i), 1), false)
	}
	e.runRuntime(projector.Config{Name: "notifier", EveryEvent: true}, nt)
	for i := range 20 {
		e.relayPublish(upsert(fmt.Sprintf("doc-%02d", i), 2), false)
	}
	// The upgraded relay: the effects' stream, then every event in both.
	e.effectsStream(cfg)
	for i := range 15 {
		e.relayPublish(upsert(fmt.Sprintf("doc-%02d", i), 3), true)
	}
	if got := len(rcv.check()); got != 10 {
		t.Fatalf("before the move: %d effects, want 10", got)
	}

	info, err := WaitForStream(context.Background(), js, ncfg.Window, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Config.Metadata[contract.MetaEventsDocsSeq]; got != "30" {
		t.Fatalf("the effects' stream began at %q of the documents' stream, want 30", got)
	}
	rc := RuntimeConfig(projector.Config{Name: "notifier", BatchSize: 16, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	left, err := Migrate(context.Background(), js, nt, rc, info, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	if left != 20 {
		t.Fatalf("the old consumer had %d events left, want 20", left)
	}
	if _, err := js.Consumer(context.Background(), contract.DocsStream, "notifier"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the old consumer after the move: %v, want it deleted", err)
	}
	m := NewMetrics(nil)
	nt2, err := New(context.Background(), js, ncfg, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nt2.Close() }()
	e.runRuntime(rc, nt2)
	perEffect := rcv.check()
	if len(perEffect) != 45 {
		t.Fatalf("%d effects notified, want all 45 events", len(perEffect))
	}
	for key, c := range perEffect {
		if c != 1 {
			t.Errorf("effect %s: %d POSTs", key, c)
		}
	}
	// Nothing left, and a second start finds nothing to move.
	if left, err := Migrate(context.Background(), js, nt2, rc, info, discardLogger()); err != nil || left != 0 {
		t.Fatalf("a second move: %d left, %v", left, err)
	}
}

// Without the effects' stream the notifier waits, saying what to do; it
// refuses a stream of that name that is not a work queue.
func TestWaitForTheEffectsStream(t *testing.T) {
	js := newBareEnv(t).js
	saved := StreamWait
	StreamWait = 20 * time.Millisecond
	t.Cleanup(func() { StreamWait = saved })
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	done := make(chan error, 1)
	go func() {
		_, err := WaitForStream(context.Background(), js, DefaultWindow, log)
		done <- err
	}()
	testenv.Eventually(t, "the waiting to be logged", 5*time.Second, func() bool {
		return strings.Contains(logs.String(), "CONVERGE_RELAY_EFFECTS=true")
	})
	select {
	case err := <-done:
		t.Fatalf("returned before the stream exists: %v", err)
	default:
	}
	cfg := relay.Config{Effects: relay.EffectsConfig{Enabled: true, MaxAge: time.Hour}}
	if _, err := relay.EnsureStream(context.Background(), js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureEffectsStream(context.Background(), js, cfg); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "keeps events for less than the notifier's window") {
		t.Errorf("a max age of an hour under a window of %v was not warned of:\n%s", DefaultWindow, logs.String())
	}

	if err := js.DeleteStream(context.Background(), contract.EventsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: contract.EventsStream,
		Subjects: []string{contract.EventsSubjectPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := WaitForStream(context.Background(), js, DefaultWindow, log); err == nil || !strings.Contains(err.Error(), "not a work queue") {
		t.Fatalf("a limits stream named %s: %v", contract.EventsStream, err)
	}
}

// An effects' stream that does not say where in the documents' stream it
// began (not made by the relay) leaves the old consumer alone: finishing
// it up to an unknown sequence could skip or repeat events, so Migrate
// refuses, naming what to do, and deletes nothing.
func TestMigrationRefusesAStreamThatDoesNotSayWhereItBegan(t *testing.T) {
	e := newBareEnv(t)
	ctx := context.Background()
	if _, err := relay.EnsureStream(ctx, e.js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateOrUpdateConsumer(ctx, contract.DocsStream, jetstream.ConsumerConfig{Durable: "notifier",
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: contract.EventsStream, Retention: jetstream.WorkQueuePolicy,
		Subjects: []string{contract.EventsSubjectPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	info, err := WaitForStream(ctx, e.js, DefaultWindow, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(ctx, e.js, testConfig("http://127.0.0.1:9/hook"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	_, err = Migrate(ctx, e.js, n, RuntimeConfig(projector.Config{Name: "notifier"}), info, discardLogger())
	if err == nil || !strings.Contains(err.Error(), "cannot be finished safely") || !strings.Contains(err.Error(), "nats consumer rm") {
		t.Fatalf("Migrate over a stream without %s: %v", contract.MetaEventsDocsSeq, err)
	}
	if _, err := e.js.Consumer(ctx, contract.DocsStream, "notifier"); err != nil {
		t.Fatalf("the old consumer after the refusal: %v, want it kept", err)
	}
}
