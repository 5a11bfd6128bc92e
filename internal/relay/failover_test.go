package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// A Postgres failover without failover slots: a primary with a
// synchronous streaming standby; the relay publishes part of the outbox,
// stops, more is committed on the primary, the primary crashes and the
// standby is promoted. The relay, pointed at the new primary, finds its
// slot missing, creates it, publishes from the outbox table everything
// committed since the newest event the stream holds, then streams from
// the new slot: every outbox event is in the stream exactly once.
func TestFailoverCatchesUpFromTheOutbox(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	ctx := context.Background()
	primary, standby := startPrimaryAndStandby(t)
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

	g := newFixtureWith(t, standby.URL("converge"), f.nats)
	pool := g.pool
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the promoted standby has %d slots (%v); want none", n, err)
	}
	metrics := relay.NewMetrics(nil)
	runRelay(t, g.nats.Connect(t), g.dbURL, fastRelay(slot), metrics)
	testenv.Eventually(t, "every committed event in the stream", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 500 })
	waitSlotActive(t, pool, slot) // streaming: the catch-up is done
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

// startPrimaryAndStandby starts a primary with the schema migrated in its
// database "converge", and a synchronous streaming standby of it.
func startPrimaryAndStandby(t *testing.T) (primary, standby *pgcluster.Cluster) {
	t.Helper()
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
	standby, err = pgcluster.StartStandby(ctx, primary, pgcluster.Config{})
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

	return primary, standby
}

// The same failover under load: a producer writes batches and the relay
// publishes them when the primary crashes. Every write acknowledged before
// the crash is on the promoted standby (synchronous replication), and
// every outbox event there ends up in the stream once: what the relay had
// not published when the primary died comes from the catch-up.
func TestFailoverUnderLoad(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	ctx := context.Background()
	primary, standby := startPrimaryAndStandby(t)
	f := newFixtureOn(t, primary.URL("converge"))
	const slot = "failover"
	old := relay.NewMetrics(nil)
	runRelay(t, f.nats.Connect(t), f.dbURL, fastRelay(slot), old)
	waitSlotActive(t, f.pool, slot)

	type acked struct {
		key     string
		version int64
	}
	var acknowledged []acked
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for version := int64(1); ; version++ {
			writes := make([]docstore.Write, 20)
			for i := range writes {
				writes[i] = docstore.Write{Doc: contract.Document{Key: fmt.Sprintf("load-%d", i), Version: version, Title: "t",
					Body: fmt.Sprintf("version %d", version)}}
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := f.store.Apply(wctx, writes)
			cancel()
			if err != nil {
				return // the primary is gone
			}
			for _, w := range writes {
				acknowledged = append(acknowledged, acked{w.Doc.Key, w.Doc.Version})
			}
		}
	}()
	testenv.Eventually(t, "the load to be relayed", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 400 })
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	<-loadDone
	inStream := streamMsgs(t, f.js)
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, standby.URL("converge"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, a := range acknowledged {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE key = $1 AND version = $2", a.key, a.version).Scan(&n); err != nil || n == 0 {
			t.Fatalf("write %s@%d was acknowledged on the primary and is not on the promoted standby (%v)", a.key, a.version, err)
		}
	}
	var outbox uint64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&outbox); err != nil {
		t.Fatal(err)
	}
	metrics := relay.NewMetrics(nil)
	runRelay(t, f.nats.Connect(t), standby.URL("converge"), fastRelay(slot), metrics)
	waitSlotActive(t, pool, slot) // streaming: the catch-up is done
	testenv.Eventually(t, "every outbox event of the new primary in the stream", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= outbox })
	events, surplus := compareWithOutbox(t, pool, storedEvents(t, f.js))
	t.Logf("%d writes acknowledged before the crash; %d events in the stream at the crash, %d in the outbox; the catch-up published %v (%v the stream had); %d stored copies beyond one",
		len(acknowledged), inStream, events, testutil.ToFloat64(metrics.CatchUp.WithLabelValues("stored")),
		testutil.ToFloat64(metrics.CatchUp.WithLabelValues("duplicate")), surplus)
	if uint64(events) != outbox || surplus != 0 {
		t.Errorf("%d outbox events compared, %d surplus; want %d, 0", events, surplus, outbox)
	}
}
