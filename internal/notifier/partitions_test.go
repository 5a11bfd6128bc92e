package notifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// partitionPublish stores ev as a relay publishing to the effects' n
// partitions does: on its partition's subject.
func (e *env) partitionPublish(ev contract.Event, n int) {
	e.t.Helper()
	data, err := ev.Encode()
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(contract.EventsPartitionSubjectPrefix(contract.Partition(ev.Key, n)) + contract.SubjectToken(ev.Key))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, ev.ID.String())
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

// relayMoved records the move to the effects' n partitions as a relay's
// session holding the slot does.
func (e *env) relayMoved(n int) {
	e.t.Helper()
	pos, err := relay.OpenPositions(context.Background(), e.js, "converge_relay", 1)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := pos.RecordEffectsMoved(context.Background(), n, "converge_relay"); err != nil {
		e.t.Fatal(err)
	}
}

// notifierService is the notifier service's configuration for tests: an
// instance named holder, with parts partitions (0: one writer) and a
// short lease.
func notifierService(url, holder string, parts int, cfg Config) ServiceConfig {
	return ServiceConfig{
		Projector: projector.ServiceConfig{NATSURL: url, Partitions: parts,
			Runtime: projector.Config{Name: "notifier", BatchSize: 16, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond},
			Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond, Holder: holder}},
		Notifier: cfg,
	}
}

// beforeTheMove has a notifier without partitions notify the first version
// of docs documents key(0)..., and stop; leaves their second versions in
// the effects' stream; and makes the effects' parts partitions, as an
// operator moving to them does.
func (e *env) beforeTheMove(rcv *receiver, cfg Config, parts, docs int, key func(int) string) {
	t := e.t
	t.Helper()
	one := stacktest.Start(t, notifierService(e.n.URL, "one", 0, cfg), Run)
	for i := range docs {
		e.relayPublish(upsert(key(i), 1), true)
	}
	testenv.Eventually(t, "the first versions notified by the one writer", 20*time.Second, func() bool { return len(rcv.requests()) == docs })
	if err := one.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range docs {
		e.relayPublish(upsert(key(i), 2), true)
	}
	rcfg := relay.Config{Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.ApplyEffectsPartitions(context.Background(), e.js, rcfg, parts, false); err != nil {
		t.Fatal(err)
	}
}

// inOrder fails t unless rcv received each document's versions one after
// another from 1.
func inOrder(t *testing.T, rcv *receiver) {
	t.Helper()
	last := map[string]int64{}
	for _, q := range rcv.requests() {
		if q.Body.Version != last[q.Body.Key]+1 {
			t.Fatalf("%s: version %d notified after %d", q.Body.Key, q.Body.Version, last[q.Body.Key])
		}
		last[q.Body.Key] = q.Body.Version
	}
}

// A deployment's notifier moves to partitions without losing an event or
// notifying one before an older one of its document: the one writer had
// notified the first versions, the second ones wait in the effects'
// stream, and the third ones reach the partitions once the relay recorded
// its move. The first partitioned instance waits for that record, then
// finishes the effects' stream and deletes its consumer; only then do two
// instances share the partitions. A notifier started without partitions
// then refuses to run; one instance stopping leaves its partitions to the
// other; every effect is sent once.
func TestPartitionedNotifiersMoveFromTheOneWriter(t *testing.T) {
	const parts, docs = 4, 40
	e := newRelayedEnv(t, 1, -1)
	ctx := context.Background()
	rcv := newReceiver(t)
	cfg := testConfig(rcv.url("/hook"))
	key := func(i int) string { return fmt.Sprintf("doc-%02d", i) }

	// The operator makes the partitions; a partitioned notifier started
	// now waits for the relay's record of the move.
	e.beforeTheMove(rcv, cfg, parts, docs, key)
	saved := StreamWait
	StreamWait = 50 * time.Millisecond
	t.Cleanup(func() { StreamWait = saved })
	a := stacktest.Start(t, notifierService(e.n.URL, "a", parts, cfg), Run)
	time.Sleep(time.Second)
	if got := len(rcv.requests()); got != docs {
		t.Fatalf("%d notifications before the relay moved, want the %d of the one writer", got, docs)
	}
	// The relay, holding the slot, records the move, then publishes to
	// the partitions.
	e.relayMoved(parts)
	for i := range docs {
		e.partitionPublish(upsert(key(i), 3), parts)
	}
	b := stacktest.Start(t, notifierService(e.n.URL, "b", parts, cfg), Run)
	testenv.Eventually(t, "every version notified", 30*time.Second, func() bool { return len(rcv.requests()) == 3*docs })
	inOrder(t, rcv)
	if _, err := e.js.Consumer(ctx, contract.EventsStream, "notifier"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the one writer's consumer after the move: %v, want it deleted", err)
	}
	testenv.Eventually(t, "the effects' stream emptied", 5*time.Second, func() bool {
		return e.streamState(contract.EventsStream).Msgs == 0
	})
	for p := range parts {
		if _, err := e.js.Consumer(ctx, contract.EventsPartitionStream(p), contract.PartitionName("notifier", p)); err != nil {
			t.Fatalf("partition %d's consumer: %v", p, err)
		}
	}

	late := stacktest.Start(t, notifierService(e.n.URL, "late", 0, cfg), Run)
	select {
	case <-late.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a notifier without partitions still runs after the move")
	}
	if err := late.Stop(); !errors.Is(err, projector.ErrPartitioned) && !errors.Is(err, errEffectsPartitioned) {
		t.Fatalf("a notifier without partitions after the move: %v, want %v or %v", err, projector.ErrPartitioned, errEffectsPartitioned)
	}

	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range docs {
		e.partitionPublish(upsert(key(i), 4), parts)
	}
	testenv.Eventually(t, "the fourth versions notified by the instance left", 30*time.Second, func() bool { return len(rcv.requests()) == 4*docs })
	for effect, n := range rcv.check() {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs", effect, n)
		}
	}
	for p := range parts {
		if rec, ok := e.gapRecord(contract.EventsPartitionStream(p), contract.PartitionName("notifier", p)); ok && rec.Missed != 0 {
			t.Errorf("partition %d reported %d events missed", p, rec.Missed)
		}
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
}

// A notifier without partitions stops, naming -partitions, once the
// operator made the effects' partitions: the relays publish there, and it
// would notify nothing new.
func TestNotifierWithoutPartitionsStopsWhenTheEffectsHaveThem(t *testing.T) {
	e := newRelayedEnv(t, 1, -1)
	saved := EffectsPartitionsCheck
	EffectsPartitionsCheck = 50 * time.Millisecond
	t.Cleanup(func() { EffectsPartitionsCheck = saved })
	rcv := newReceiver(t)
	one := stacktest.Start(t, notifierService(e.n.URL, "one", 0, testConfig(rcv.url("/hook"))), Run)
	e.relayPublish(upsert("doc", 1), true)
	testenv.Eventually(t, "the one writer to notify", 20*time.Second, func() bool { return len(rcv.requests()) == 1 })
	if _, err := relay.ApplyEffectsPartitions(context.Background(), e.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}, 2, false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-one.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier without partitions still runs")
	}
	if err := one.Stop(); !errors.Is(err, errEffectsPartitioned) || !strings.Contains(err.Error(), "-partitions 2") {
		t.Fatalf("the notifier without partitions: %v, want %v naming -partitions 2", err, errEffectsPartitioned)
	}
}

// A relay of an older version still publishes to the effects' stream
// after the relay's record of the move, once the move has drained it, and
// again once the move has deleted its consumer: the move, finding an
// event there, takes the move again (with a consumer made anew the second
// time) and notifies it; every effect is sent once, each document's in
// order, and the consumer goes in the end.
func TestNotifierMoveFinishesWhatReachesTheEffectsStreamLate(t *testing.T) {
	const parts, docs = 4, 10
	e := newRelayedEnv(t, 1, -1)
	ctx := context.Background()
	rcv := newReceiver(t)
	cfg := testConfig(rcv.url("/hook"))
	key := func(i int) string { return fmt.Sprintf("doc-%02d", i) }
	e.beforeTheMove(rcv, cfg, parts, docs, key)
	e.relayMoved(parts)
	var drains, deletes atomic.Int32
	moveStep = func(step string) {
		switch {
		case step == "drained" && drains.Add(1) == 1:
			e.relayPublish(upsert("late", 1), true) // an older relay, after the record
		case step == "deleted" && deletes.Add(1) == 1:
			e.relayPublish(upsert("later", 1), true) // and as the consumer goes
		}
	}
	t.Cleanup(func() { moveStep = nil })
	for i := range docs {
		e.partitionPublish(upsert(key(i), 3), parts)
	}
	e.partitionPublish(upsert("late", 2), parts)
	e.partitionPublish(upsert("later", 2), parts)
	a := stacktest.Start(t, notifierService(e.n.URL, "a", parts, cfg), Run)
	testenv.Eventually(t, "every version notified", 30*time.Second, func() bool { return len(rcv.requests()) == 3*docs+4 })
	inOrder(t, rcv)
	if n := drains.Load(); n < 3 {
		t.Errorf("the move drained the effects' stream %d times, want 3 or more (the first refused to delete the consumer, the second found an event after the delete)", n)
	}
	testenv.Eventually(t, "the effects' stream's consumer deleted", 10*time.Second, func() bool {
		_, err := e.js.Consumer(ctx, contract.EventsStream, "notifier")
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})
	for effect, n := range rcv.check() {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs", effect, n)
		}
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
}
