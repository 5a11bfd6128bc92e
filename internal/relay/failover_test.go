package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
)

// A Postgres failover without failover slots: a primary with a
// synchronous streaming standby; the relay publishes part of the outbox,
// stops, more is committed on the primary, the primary crashes and the
// standby is promoted. The relay, pointed at the new primary, finds its
// slot missing, creates it, publishes from the outbox table everything
// committed since the newest event the stream holds, then streams from
// the new slot: every outbox event is in the stream exactly once.
func TestFailoverCatchesUpFromTheOutbox(t *testing.T) {
	ctx := context.Background()
	primary, err := pgcluster.Start(ctx, pgcluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	admin, err := pgxpool.New(ctx, primary.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE converge"); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.Up(ctx, primary.URL("converge")); err != nil {
		t.Fatal(err)
	}
	standby, err := pgcluster.StartStandby(ctx, primary, pgcluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop(context.Background()) })
	// Synchronous: a commit the writer was told of is on the standby too.
	for _, sql := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "the standby to be synchronous", 30*time.Second, func() bool {
		var n int
		_ = admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&n)
		return n == 1
	})
	admin.Close()

	f := newFixtureOn(t, primary.URL("converge"))
	const slot = "failover"
	func() {
		r := runRelayUntil(t, f, slot)
		defer r.stop()
		waitSlotActive(t, f.pool, slot) // what is written before the slot exists is not relayed
		f.write(t, 0, 200, 1)
		testenv.Eventually(t, "200 events relayed", 30*time.Second, func() bool { return streamMsgs(t, f.js) == 200 })
	}()
	// Committed on the primary while no relay runs: in the outbox, not in
	// the stream.
	f.write(t, 200, 500, 1)
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	pool, err := pgxpool.New(ctx, standby.URL("converge"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &fixture{dbURL: standby.URL("converge"), pool: pool, store: store, nats: f.nats, js: f.js}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the promoted standby has %d slots (%v); want none", n, err)
	}
	metrics := relay.NewMetrics(nil)
	runRelay(t, g.nats.Connect(t), g.dbURL, fastRelay(slot), metrics)
	testenv.Eventually(t, "every committed event in the stream", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 500 })
	stored := testutil.ToFloat64(metrics.CatchUp.WithLabelValues("stored"))
	dups := testutil.ToFloat64(metrics.CatchUp.WithLabelValues("duplicate"))
	t.Logf("the catch-up published %v events from the outbox (%v the stream had)", stored, dups)
	if stored != 300 {
		t.Errorf("the catch-up stored %v events, want the 300 committed after the last relayed", stored)
	}
	// converge status reads the record of it.
	testenv.Eventually(t, "the catch-up recorded", 10*time.Second, func() bool {
		cu, ok, err := relay.ReadCatchUp(ctx, f.js, slot)
		return err == nil && ok && cu.Stored == 300 && cu.Duplicates == int(dups)
	})
	// Then the new slot streams what comes next.
	g.write(t, 500, 600, 1)
	testenv.Eventually(t, "events written after the failover", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 600 })
	events, surplus := compareWithOutbox(t, pool, storedEvents(t, f.js))
	if events != 600 || surplus != 0 {
		t.Errorf("%d outbox events, %d stored copies beyond one; want 600, 0", events, surplus)
	}
}

type stoppable struct{ stop func() }

// runRelayUntil runs a relay of the fixture's database on slot until stop.
func runRelayUntil(t *testing.T, f *fixture, slot string) stoppable {
	t.Helper()
	cfg := fastRelay(slot)
	cfg.Stream.MaxMsgsPerSubject = -1
	return stoppable{stop: f.startRelay(t, cfg)}
}
