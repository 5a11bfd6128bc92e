package relay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
)

// A slot that resumes behind the position the relay recorded (what a
// Postgres crash does: the slot's position is saved only now and then)
// resends transactions already in the stream. Once the duplicate window
// has forgotten their ids (as a restarted NATS server forgets those of
// messages it no longer stores), JetStream would store each again; the
// relay, reading its recorded position, publishes none of them. A record of
// another cluster or timeline is not trusted: that relay runs
// a catch-up from the outbox instead, which finds every event stored and
// skips the slot's copies of them.
//
// The rewound slots are copies of the relay's slot taken before any event
// (pg_copy_logical_replication_slot), given the relay's record.
func TestRecordedPositionSkipsWhatARewoundSlotResends(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const events = 200
	stream := relay.StreamConfig{MaxMsgsPerSubject: -1, Duplicates: time.Second}
	run := func(slot string, metrics *relay.Metrics) (stop func()) {
		cfg := fastRelay(slot)
		cfg.Stream = stream
		_, stop = f.runWith(t, cfg, metrics, nil)
		return stop
	}
	stop := run("pos_a", relay.NewMetrics(nil))
	waitSlotActive(t, f.pool, "pos_a")
	for _, copy := range []string{"pos_b", "pos_c"} {
		if _, err := f.pool.Exec(ctx, `SELECT pg_copy_logical_replication_slot('pos_a', $1)`, copy); err != nil {
			t.Fatal(err)
		}
	}
	f.write(t, 0, events, 1)
	testenv.Eventually(t, "every event in the stream", 20*time.Second, func() bool { return streamMsgs(t, f.js) == events })
	waitConfirmedPastNow(t, f.pool, "pos_a", 10*time.Second)
	stop()

	pos, err := relay.OpenPositions(ctx, f.js, "pos_a", 1)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := pos.Read(ctx)
	if err != nil || !ok {
		t.Fatalf("the relay recorded no position: %v", err)
	}
	var confirmed string
	if err := f.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'pos_a'`).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if rec.LSN != confirmed || rec.SystemID == "" || rec.Timeline < 1 {
		t.Fatalf("record %+v, want the slot's confirmed position %s with the system and timeline", rec, confirmed)
	}
	kv, err := f.js.KeyValue(ctx, relay.PositionBucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(slot string, p relay.Position) {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, slot, b); err != nil {
			t.Fatal(err)
		}
	}
	put("pos_b", rec)
	other := rec
	other.SystemID = "7000000000000000000"
	put("pos_c", other)
	time.Sleep(1500 * time.Millisecond) // the duplicate window forgets the ids

	mb := relay.NewMetrics(nil)
	stop = run("pos_b", mb)
	f.write(t, events, events+10, 1)
	testenv.Eventually(t, "the 10 new events", 20*time.Second, func() bool { return streamMsgs(t, f.js) >= events+10 })
	waitConfirmedPastNow(t, f.pool, "pos_b", 10*time.Second)
	stop()
	if n := streamMsgs(t, f.js); n != events+10 {
		t.Fatalf("the stream holds %d messages after the rewound slot, want %d: the resent events were stored again", n, events+10)
	}
	if s, d := testutil.ToFloat64(mb.Skipped), testutil.ToFloat64(mb.Duplicates); s != events || d != 0 {
		t.Fatalf("skipped %v, republished %v; want the %d resent events skipped, none republished", s, d, events)
	}

	// With a record of another cluster the slot is not trusted: the relay
	// catches up from the outbox first, finds every event in the stream,
	// and skips the slot's copies of what it read. Nothing is stored
	// twice either.
	mc := relay.NewMetrics(nil)
	stop = run("pos_c", mc)
	testenv.Eventually(t, "the catch-up", 20*time.Second, func() bool { return testutil.ToFloat64(mc.CatchUp.WithLabelValues("held")) == events+10 })
	waitSlotActive(t, f.pool, "pos_c")
	waitConfirmedPastNow(t, f.pool, "pos_c", 10*time.Second)
	stop()
	if s, p := testutil.ToFloat64(mc.Skipped), testutil.ToFloat64(mc.CatchUp.WithLabelValues("stored")); s != events+10 || p != 0 {
		t.Fatalf("a record of another system: skipped %v, the catch-up published %v; want %d skipped, none published", s, p, events+10)
	}
	if n := streamMsgs(t, f.js); n != events+10 {
		t.Fatalf("after a catch-up over a slot it did not trust the stream holds %d messages, want %d", n, events+10)
	}
}
