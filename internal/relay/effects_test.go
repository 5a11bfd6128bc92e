package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo()
}

// readEffectsMoved reads the relay's record of the move to the effects'
// partitions; false when there is none.
func readEffectsMoved(t *testing.T, js jetstream.JetStream) (contract.EffectsMoved, bool, error) {
	t.Helper()
	var m contract.EffectsMoved
	kv, err := js.KeyValue(context.Background(), contract.RelayBucket)
	if err != nil {
		return m, false, err
	}
	found, err := sharedkv.GetJSON(context.Background(), kv, contract.EffectsMovedKey, &m)
	return m, found, err
}

// readEvents reads every message of the effects' stream, in order.
func readEvents(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(context.Background(), contract.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	st := s.CachedInfo().State
	var out []*jetstream.RawStreamMsg
	for seq := st.FirstSeq; seq <= st.LastSeq && st.Msgs > 0; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("effects' stream message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// With effects on, the relay publishes every event to the effects' stream
// too, in commit order, with the documents' stream's message id and
// headers; the documents' stream keeps its bounded history, the effects'
// stream every event, and a restart republishes nothing.
func TestRelayPublishesEveryEventToTheEffectsStream(t *testing.T) {
	f := newFixture(t)
	metrics := relay.NewMetrics(nil)
	cfg := relay.Config{StatusInterval: 50 * time.Millisecond,
		Stream: relay.StreamConfig{MaxMsgsPerSubject: 2}, Effects: relay.EffectsConfig{Enabled: true}}
	_, stop := f.runWith(t, cfg, metrics, nil)
	f.waitSlot(t)
	const docs, versions = 100, 5
	for v := int64(1); v <= versions; v++ {
		f.write(t, 0, docs, v)
	}
	testenv.Eventually(t, "every event in the effects' stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == docs*versions
	})
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	if n := streamInfo(t, f.js, contract.DocsStream).State.Msgs; n != docs*2 {
		t.Fatalf("the documents' stream holds %d messages, want its history of 2 per document: %d", n, docs*2)
	}
	info := streamInfo(t, f.js, contract.EventsStream)
	if info.Config.Retention != jetstream.WorkQueuePolicy || info.Config.MaxAge != relay.DefaultEffectsMaxAge ||
		info.Config.Metadata[contract.MetaEventsDocsSeq] != "0" {
		t.Fatalf("effects' stream: retention %v, max age %v, metadata %v", info.Config.Retention, info.Config.MaxAge, info.Config.Metadata)
	}
	last := map[string]int64{}
	for i, m := range readEvents(t, f.js) {
		ev, err := contract.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Subject != contract.EventsSubject(ev.Key) || m.Header.Get(jetstream.MsgIDHeader) != ev.ID.String() ||
			m.Header.Get(contract.HeaderCommitTime) == "" {
			t.Fatalf("message %d: subject %s, id %q, commit time %q, for event %s of %s", i, m.Subject,
				m.Header.Get(jetstream.MsgIDHeader), m.Header.Get(contract.HeaderCommitTime), ev.ID, ev.Key)
		}
		if ev.Version != last[ev.Key]+1 {
			t.Fatalf("message %d: %s version %d after %d: not in commit order", i, ev.Key, ev.Version, last[ev.Key])
		}
		last[ev.Key] = ev.Version
	}
	if got := testutil.ToFloat64(metrics.EffectsPublished); got != docs*versions {
		t.Fatalf("effects published: %v, want %d", got, docs*versions)
	}
	stop()

	again := relay.NewMetrics(nil)
	_, stop = f.runWith(t, cfg, again, nil)
	f.write(t, 0, 1, versions+1)
	testenv.Eventually(t, "the new event in the effects' stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == docs*versions+1
	})
	stop()
	if d := testutil.ToFloat64(again.EffectsDuplicates) + testutil.ToFloat64(again.Duplicates); d != 0 {
		t.Fatalf("the restart republished %v events", d)
	}
}

// A transaction is confirmed only once both streams stored all its events:
// when the effects' stream refuses events (here a limit an operator set
// on it), the session ends, the relay resumes from the confirmed position,
// and every refused event reaches the effects' stream once the stream
// takes it again, none lost and none twice. The relay never changes a
// stream: it reports the limit that differs from its configuration, and
// the operator restores it (converge streams apply).
func TestRelayConfirmsOnlyWhatBothStreamsStored(t *testing.T) {
	f := newFixture(t)
	metrics := relay.NewMetrics(nil)
	cfg := relay.Config{StandbyRetry: 100 * time.Millisecond,
		Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}, Effects: relay.EffectsConfig{Enabled: true}}
	var logs testenv.LockedBuffer
	_, stop := f.runWith(t, cfg, metrics, slog.New(slog.NewTextHandler(&logs, nil)))
	f.waitSlot(t)
	f.write(t, 0, 50, 1)
	testenv.Eventually(t, "50 events in the effects' stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == 50
	})
	// The operator caps the effects' stream at 60 messages, refusing more.
	sc := streamInfo(t, f.js, contract.EventsStream).Config
	sc.MaxMsgs, sc.Discard = 60, jetstream.DiscardNew
	if _, err := f.js.UpdateStream(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	f.write(t, 50, 300, 1)
	testenv.Eventually(t, "the relay to end a session on the refusal", 20*time.Second, func() bool {
		return testutil.ToFloat64(metrics.SessionErrors.WithLabelValues("publish")) > 0
	})
	testenv.Eventually(t, "the relay to name the limit and the command", 20*time.Second, func() bool {
		l := logs.String()
		return strings.Contains(l, "MaxMsgs 60, configured -1") && strings.Contains(l, "Discard DiscardNew, configured DiscardOld") &&
			strings.Contains(l, "converge streams apply")
	})
	if sc := streamInfo(t, f.js, contract.EventsStream).Config; sc.MaxMsgs != 60 {
		t.Fatalf("the relay changed the effects' stream: max msgs %d", sc.MaxMsgs)
	}
	if _, err := relay.ApplyEffectsStream(context.Background(), f.js, cfg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "all 300 events in both streams", 30*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == 300 && streamInfo(t, f.js, contract.DocsStream).State.Msgs == 300
	})
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	stop()
	seen := map[string]bool{}
	for _, m := range readEvents(t, f.js) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if seen[id] {
			t.Fatalf("event %s stored twice in the effects' stream", id)
		}
		seen[id] = true
	}
	if len(seen) != 300 {
		t.Fatalf("%d distinct events in the effects' stream, want 300", len(seen))
	}
	if sc := streamInfo(t, f.js, contract.EventsStream).Config; sc.MaxMsgs != -1 || sc.Discard != jetstream.DiscardOld {
		t.Fatalf("the operator did not restore the effects' stream's limits: max msgs %d, discard %v", sc.MaxMsgs, sc.Discard)
	}
}

// A relay without -effects over a deployment whose effects' stream exists
// (a standby configured apart from the active relay) says so at error
// level: the notifier would not see the events it publishes.
func TestRelayWithoutEffectsWarnsWhenTheStreamExists(t *testing.T) {
	f := newFixture(t)
	if _, err := relay.EnsureStream(context.Background(), f.js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureEffectsStream(context.Background(), f.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LockedBuffer
	_, stop := f.runWith(t, relay.Config{}, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	testenv.Eventually(t, "the warning", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "the effects' stream exists but this relay runs without -effects")
	})
	stop()
}

// runWith runs a relay with cfg over the fixture's database and server,
// with metrics and log (each nil: none), until the returned stop, which
// checks that Run ended cleanly.
func (f *fixture) runWith(t *testing.T, cfg relay.Config, metrics *relay.Metrics, log *slog.Logger) (r *relay.Relay, stop func()) {
	t.Helper()
	cfg.PostgresURL = f.dbURL
	r, err := relay.New(f.nats.Connect(t), cfg, metrics, log)
	if err != nil {
		t.Fatal(err)
	}
	return r, run(t, r)
}

// run runs r until the returned stop.
func run(t *testing.T, r *relay.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// The move of the effects to their partitions: the operator makes them
// while a relay publishes and a standby waits. The running relay's session
// ends within a lag check, and the next one records the move in the
// relay's bucket, holding the slot, before it publishes each event for
// effects to its document's partition and no longer to the effects'
// stream. The standby, taking over, publishes there too, and the record
// is not written again. The partitions' number changes only while they
// are empty.
func TestRelayMovesEffectsToTheirPartitions(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cfg := relay.Config{StatusInterval: 50 * time.Millisecond, LagCheckInterval: 100 * time.Millisecond, Effects: relay.EffectsConfig{Enabled: true}}
	metrics, standbyMetrics := relay.NewMetrics(nil), relay.NewMetrics(nil)
	_, stop := f.runWith(t, cfg, metrics, nil)
	f.waitSlot(t)
	standby, stopStandby := f.runWith(t, cfg, standbyMetrics, nil)
	const docs = 60
	f.write(t, 0, docs, 1)
	testenv.Eventually(t, "the first versions in the effects' stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == docs
	})
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	if _, ok, err := readEffectsMoved(t, f.js); err != nil || ok {
		t.Fatalf("the move recorded before the partitions exist: %v, %v", ok, err)
	}

	const n = 4
	if res, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, n, false); err != nil || res != relay.PartsCreated {
		t.Fatalf("apply the effects' partitions: %v, %v", res, err)
	}
	var moved contract.EffectsMoved
	testenv.Eventually(t, "the running relay to record the move", 20*time.Second, func() bool {
		m, ok, err := readEffectsMoved(t, f.js)
		moved = m
		return err == nil && ok
	})
	if moved.Partitions != n || moved.Slot != "converge_relay" {
		t.Fatalf("the move's record: %+v", moved)
	}
	f.write(t, 0, docs, 2)
	partitioned := func() (msgs uint64) {
		for p := range n {
			msgs += streamInfo(t, f.js, contract.EventsPartitionStream(p)).State.Msgs
		}
		return msgs
	}
	testenv.Eventually(t, "the second versions in the partitions", 20*time.Second, func() bool { return partitioned() == docs })
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	stop()
	testenv.Eventually(t, "the standby to take over (if it had not when the session ended)", 20*time.Second, standby.Active)
	f.write(t, 0, docs, 3)
	testenv.Eventually(t, "the third versions in the partitions", 20*time.Second, func() bool { return partitioned() == 2*docs })
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	stopStandby()
	// Either relay may have held the slot when the partitions were made.
	if got := testutil.ToFloat64(metrics.EffectsPublished) + testutil.ToFloat64(standbyMetrics.EffectsPublished); got < 3*docs {
		t.Fatalf("effects published by the two relays: %v, want at least %d", got, 3*docs)
	}
	if again, _, err := readEffectsMoved(t, f.js); err != nil || !again.At.Equal(moved.At) {
		t.Fatalf("the move's record after the standby took over: %+v, %v; want the first, %+v", again, err, moved)
	}
	events := readEvents(t, f.js)
	if len(events) != docs {
		t.Fatalf("the effects' stream holds %d messages, want the %d first versions alone", len(events), docs)
	}
	for _, m := range events {
		if ev, err := contract.DecodeEvent(m.Data); err != nil || ev.Version != 1 {
			t.Fatalf("the effects' stream holds %s (%v): want first versions only", m.Subject, err)
		}
	}
	for p := range n {
		s, err := f.js.Stream(ctx, contract.EventsPartitionStream(p))
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Retention != jetstream.WorkQueuePolicy || info.Config.Metadata[contract.MetaPartitions] != "4" {
			t.Fatalf("%s: retention %v, metadata %v", info.Config.Name, info.Config.Retention, info.Config.Metadata)
		}
		last := map[string]int64{}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := contract.DecodeEvent(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Version < 2 || ev.Version <= last[ev.Key] || m.Subject != contract.EventsPartitionSubjectPrefix(p)+contract.SubjectToken(ev.Key) || contract.Partition(ev.Key, n) != p {
				t.Fatalf("%s holds version %d of %s (after %d) on %s (its partition: %d)", info.Config.Name, ev.Version, ev.Key, last[ev.Key], m.Subject, contract.Partition(ev.Key, n))
			}
			last[ev.Key] = ev.Version
		}
	}
	removals := streamInfo(t, f.js, contract.RemovalsStream).Config.Subjects
	if len(removals) != n+1 || removals[n] != contract.RemovalsSubject(contract.EventsPartitionStream(n-1), "*") {
		t.Fatalf("the removals' stream records %v: want the effects' stream and its %d partitions", removals, n)
	}

	if _, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, 2, false); !errors.Is(err, relay.ErrEffectsRepartition) {
		t.Fatalf("another number of partitions without -repartition: %v", err)
	}
	if _, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, 2, true); !errors.Is(err, relay.ErrEffectsRepartition) || !strings.Contains(err.Error(), "holds") {
		t.Fatalf("another number of partitions that hold events: %v", err)
	}
	for p := range n {
		s, err := f.js.Stream(ctx, contract.EventsPartitionStream(p))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, 2, true); err != nil || res != relay.PartsRecreated {
		t.Fatalf("another number of empty partitions with -repartition: %v, %v", res, err)
	}
	if _, err := f.js.Stream(ctx, contract.EventsPartitionStream(2)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("partition 2 of the 4 of before: %v", err)
	}
}

// A session that read the effects' partitions before the operator made
// them, and takes the slot after, reads them again holding the slot and
// publishes nothing to the effects' stream: another session may have
// recorded the move meanwhile, after which the notifier no longer reads
// that stream. (The running session's watch is kept out of the way.)
func TestRelaySessionReadsThePartitionsAgainHoldingTheSlot(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cfg := relay.Config{StatusInterval: 50 * time.Millisecond, LagCheckInterval: time.Hour, StandbyRetry: 50 * time.Millisecond,
		Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.EnsureStream(ctx, f.js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureEffectsStream(ctx, f.js, cfg); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(relay.SetBeforeSlotLock(func() {
		once.Do(func() {
			if _, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, 2, false); err != nil {
				t.Error(err)
			}
		})
	}))
	_, stop := f.runWith(t, cfg, nil, nil)
	defer func() { stop() }()
	f.write(t, 0, 20, 1)
	partitioned := func() (msgs uint64) {
		for p := range 2 {
			s, err := f.js.Stream(ctx, contract.EventsPartitionStream(p))
			if err != nil {
				return 0 // not made yet
			}
			msgs += s.CachedInfo().State.Msgs
		}
		return msgs
	}
	testenv.Eventually(t, "every event in the partitions", 20*time.Second, func() bool { return partitioned() == 20 })
	if n := streamInfo(t, f.js, contract.EventsStream).State.Msgs; n != 0 {
		t.Fatalf("the effects' stream holds %d events published after the partitions were made", n)
	}
	if _, ok, err := readEffectsMoved(t, f.js); err != nil || !ok {
		t.Fatalf("the move's record: %v, %v", ok, err)
	}

	// The partitions gone after the move (here deleted, and the streams
	// applied without them): the relay publishes nothing, not even to the
	// effects' stream, which the notifier no longer reads, until they
	// exist again.
	stop()
	for p := range 2 {
		if err := f.js.DeleteStream(ctx, contract.EventsPartitionStream(p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := relay.ApplyEffectsStream(ctx, f.js, cfg); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LockedBuffer
	_, stop = f.runWith(t, cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	f.write(t, 20, 25, 1)
	testenv.Eventually(t, "the relay to refuse, naming the move", 20*time.Second, func() bool {
		return strings.Contains(logs.String(), "the effects moved to their partitions")
	})
	if n := streamInfo(t, f.js, contract.EventsStream).State.Msgs; n != 0 {
		t.Fatalf("the effects' stream holds %d events published after the move", n)
	}
	if _, err := relay.ApplyEffectsPartitions(ctx, f.js, cfg, 2, false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the new events in the partitions made anew", 20*time.Second, func() bool { return partitioned() == 5 })
}

// A catch-up publishes the copy for effects of a row the documents'
// stream holds already: whether that copy is stored cannot be read (a
// work queue keeps nothing acknowledged), and a catch-up that stopped
// between the two acknowledgements would otherwise leave it out for good.
// Here the effects' stream lost every copy (made anew), and the slot and
// the relay's record of its position are gone: the catch-up of the whole
// outbox publishes each again.
func TestCatchUpPublishesTheEffectsOfRowsTheStreamHolds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cfg := relay.Config{StatusInterval: 50 * time.Millisecond, Effects: relay.EffectsConfig{Enabled: true}}
	_, stop := f.runWith(t, cfg, nil, nil)
	f.waitSlot(t)
	const docs = 30
	f.write(t, 0, docs, 1)
	testenv.Eventually(t, "the events in the effects' stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.EventsStream).State.Msgs == docs
	})
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	stop()
	// Made anew: a purge would keep the stream's duplicate window, which
	// drops the copies a catch-up publishes again.
	if err := f.js.DeleteStream(ctx, contract.EventsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `SELECT pg_drop_replication_slot('converge_relay')`); err != nil {
		t.Fatal(err)
	}
	// Without the relay's record of its position (and marks), the
	// catch-up reads the whole outbox.
	kv, err := f.js.KeyValue(ctx, relay.PositionBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "converge_relay"); err != nil {
		t.Fatal(err)
	}
	metrics := relay.NewMetrics(nil)
	var logs testenv.LockedBuffer
	_, stop = f.runWith(t, cfg, metrics, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	testenv.Eventually(t, "the catch-up to end, every copy for effects published again", 20*time.Second, func() bool {
		s, err := f.js.Stream(ctx, contract.EventsStream)
		return err == nil && s.CachedInfo().State.Msgs == docs && strings.Contains(logs.String(), "caught up from the outbox")
	})
	if l := logs.String(); !strings.Contains(l, "held_by_stream="+strconv.Itoa(docs)) {
		t.Fatalf("the catch-up did not find the %d rows held by the documents' stream:\n%s", docs, l)
	}
	if held := testutil.ToFloat64(metrics.CatchUp.WithLabelValues("held")); held != docs {
		t.Fatalf("the catch-up found %v rows held by the documents' stream, want %d", held, docs)
	}
	if n := streamInfo(t, f.js, contract.DocsStream).State.Msgs; n != docs {
		t.Fatalf("the documents' stream holds %d messages, want %d: nothing published to it again", n, docs)
	}
}
