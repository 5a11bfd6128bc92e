package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	vpostgres "github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// failedOver is a Postgres failover with the relay down: a primary with a
// synchronous standby, a relay that published the first documents and
// stopped, more committed on the primary meanwhile, then the primary
// crashed and the standby promoted. old is the fixture of the old primary,
// fresh the new primary's, on the same NATS server.
type failedOver struct {
	old, fresh *fixture
	standby    *pgcluster.Cluster
}

const failoverSlot = "failover"

// failOver runs it: relayed documents go through the relay; then, with
// no relay running, whileDown writes on the old primary.
func failOver(t *testing.T, relayed int, whileDown func(f *fixture)) failedOver {
	t.Helper()
	ctx := context.Background()
	primary, standby := startPrimaryAndStandby(t)
	f := newFixtureOn(t, primary.URL("converge"))
	func() {
		r := runRelayUntil(t, f, failoverSlot)
		defer r.stop()
		waitSlotActive(t, f.pool, failoverSlot)
		f.write(t, 0, relayed, 1)
		testenv.Eventually(t, "the first events relayed", 30*time.Second, func() bool { return streamMsgs(t, f.js) == uint64(relayed) })
		// A mark covers them, recorded with the position.
		time.Sleep(time.Second)
	}()
	whileDown(f)
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	return failedOver{old: f, fresh: newFixtureWith(t, standby.URL("converge"), f.nats), standby: standby}
}

// settle waits until the stream holds the new primary's every outbox
// event, then writes more and waits for them (the slot streams), and
// compares: every event of the outbox in the stream once, nothing else,
// each document's versions in order.
func (fo failedOver) settle(t *testing.T) {
	t.Helper()
	g := fo.fresh
	want := func() uint64 { return uint64(outboxCount(t, g.pool)) }
	testenv.Eventually(t, "every outbox event of the new primary in the stream", 60*time.Second, func() bool { return streamMsgs(t, g.js) >= want() })
	g.write(t, 100000, 100050, 1)
	testenv.Eventually(t, "events written after the failover", 30*time.Second, func() bool { return streamMsgs(t, g.js) >= want() })
	events, surplus := compareWithOutbox(t, g.pool, storedEvents(t, g.js))
	if surplus != 0 {
		t.Errorf("%d events, %d stored copies beyond one", events, surplus)
	}
	t.Logf("%d outbox events, each in the stream once", events)
	verifyGraphOfStream(t, g)
}

// verifyGraphOfStream projects the whole stream into an embedded graph,
// as the graph projector does, and compares it with Postgres as converge
// verify does: every document, its version, content, chunks, links and
// tags.
func verifyGraphOfStream(t *testing.T, g *fixture) {
	t.Helper()
	ctx := context.Background()
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	proj, err := graph.New(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	var evs []*contract.Event
	project := func() {
		for i, r := range proj.Apply(ctx, evs) {
			if r.Err != nil {
				t.Fatalf("project %s v%d: %v", evs[i].Key, evs[i].Version, r.Err)
			}
		}
		evs = evs[:0]
	}
	readStream(t, g.js, func(m jetstream.Msg, ev contract.Event) {
		if evs = append(evs, &ev); len(evs) == 500 {
			project()
		}
	})
	project()
	docs, err := verify.ReadGraph(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := verify.Compare(ctx, &vpostgres.Postgres{Pool: g.pool}, &verify.Memory{Label: "graph", Docs: docs}, verify.Graph, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Agrees {
		t.Fatalf("verify: the graph of the stream disagrees with Postgres: %d differences, e.g. %+v", len(rep.Differences), rep.Differences[:min(3, len(rep.Differences))])
	}
	t.Logf("verify: the graph of the stream agrees with Postgres on all %d documents", rep.Documents)
}

// After a failover, `converge migrate up` runs before the relay (as the
// compose stack's migrate job does) and creates the slot on the new
// primary. The slot is there when the relay starts, yet what the old
// primary committed while no relay ran is in no stream: the relay must
// catch up all the same.
func TestFailoverWithMigrateUpBeforeTheRelay(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	fo := failOver(t, 200, func(f *fixture) { f.write(t, 200, 500, 1) })
	if created, err := schema.EnsureSlot(context.Background(), fo.fresh.dbURL, failoverSlot); err != nil || !created {
		t.Fatalf("migrate up's slot: created %v, %v", created, err)
	}
	metrics := relay.NewMetrics(nil)
	runRelay(t, fo.fresh.nats.Connect(t), fo.fresh.dbURL, fastRelay(failoverSlot), metrics)
	fo.settle(t)
	if got := testutil.ToFloat64(metrics.CatchUp.WithLabelValues("stored")); got != 300 {
		t.Errorf("the catch-up stored %v events, want the 300 the relay had not published", got)
	}
	cu, ok, err := relay.ReadCatchUp(context.Background(), fo.fresh.js, failoverSlot)
	if err != nil || !ok || cu.Window != "snapshot" || !strings.Contains(cu.Reason, "timeline") {
		t.Errorf("catch-up record %+v (%v, %v): want one over a mark's snapshot, after a timeline change", cu, ok, err)
	}
}

// The new primary runs in a time zone half an hour off the hour, with a
// date style that is not ISO: the catch-up reads the outbox all the same.
func TestFailoverUnderAHalfHourTimeZoneAndSQLDateStyle(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	fo := failOver(t, 100, func(f *fixture) { f.write(t, 100, 300, 1) })
	for _, sql := range []string{`ALTER DATABASE converge SET timezone = 'Asia/Kolkata'`, `ALTER DATABASE converge SET datestyle = 'SQL, DMY'`} {
		if _, err := fo.fresh.pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	fo.fresh.pool.Reset() // new sessions take the settings
	var tz, style string
	if err := fo.fresh.pool.QueryRow(context.Background(), `SELECT current_setting('timezone'), current_setting('datestyle')`).Scan(&tz, &style); err != nil || tz != "Asia/Kolkata" || style != "SQL, DMY" {
		t.Fatalf("settings %q %q (%v)", tz, style, err)
	}
	runRelay(t, fo.fresh.nats.Connect(t), fo.fresh.dbURL, fastRelay(failoverSlot), nil)
	fo.settle(t)
}

// A writer's transaction waits on a lock for longer than any margin a
// catch-up by commit time could allow, then commits after newer events
// were relayed: its outbox row's created_at (its start) is older than
// them. The relay is down when it commits, and the primary fails: the
// catch-up must find it.
func TestFailoverFindsATransactionHeldOpenLong(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	ctx := context.Background()
	var heldDone chan error
	fo := failOver(t, 100, func(f *fixture) {
		f.write(t, 100, 101, 1) // the document the held transaction updates
		lock, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Rollback(ctx)
		if _, err := lock.Exec(ctx, `SELECT 1 FROM documents WHERE key = $1 FOR UPDATE`, "doc-100"); err != nil {
			t.Fatal(err)
		}
		heldDone = make(chan error, 1)
		go func() {
			_, err := f.store.Apply(ctx, []docstore.Write{{Doc: contract.Document{Key: "doc-100", Version: 2, Title: "t", Body: "held"}}})
			heldDone <- err
		}()
		// Newer events commit and are relayed while it waits.
		r := runRelayUntil(t, f, failoverSlot)
		time.Sleep(3 * time.Second)
		f.write(t, 101, 200, 1)
		testenv.Eventually(t, "the newer events relayed", 30*time.Second, func() bool { return streamMsgs(t, f.js) == 200 })
		time.Sleep(time.Second)
		r.stop()
		if err := lock.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-heldDone; err != nil {
			t.Fatal(err)
		}
	})
	var created, committedBefore time.Time
	if err := fo.fresh.pool.QueryRow(ctx, `SELECT created_at, (SELECT max(created_at) FROM outbox WHERE key <> $1) FROM outbox WHERE key = $1 AND version = 2`, "doc-100").Scan(&created, &committedBefore); err != nil {
		t.Fatalf("the held transaction's row on the new primary: %v", err)
	}
	t.Logf("the held transaction's row was created %v before the newest relayed event", committedBefore.Sub(created).Round(time.Millisecond))
	runRelay(t, fo.fresh.nats.Connect(t), fo.fresh.dbURL, fastRelay(failoverSlot), nil)
	fo.settle(t)
}

// Two relays of the slot start at once after a failover: one catches up
// and streams, the other waits; neither streams while the other catches
// up, so each document's events are stored in order, once.
func TestFailoverWithTwoRelaysStartedAtOnce(t *testing.T) {
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	fo := failOver(t, 200, func(f *fixture) {
		f.write(t, 200, 2000, 1)
		f.write(t, 0, 2000, 2)
	})
	// A producer goes on writing on the new primary meanwhile: what the
	// slot streams is newer than what the catch-up reads, and must not be
	// stored before it.
	producing := make(chan struct{})
	go func() {
		defer close(producing)
		for from := 0; from < 2000; from += 100 {
			fo.fresh.write(t, from, from+100, 3)
		}
	}()
	metrics := []*relay.Metrics{relay.NewMetrics(nil), relay.NewMetrics(nil)}
	var wg sync.WaitGroup
	for i := range metrics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runRelay(t, fo.fresh.nats.Connect(t), fo.fresh.dbURL, fastRelay(failoverSlot), metrics[i])
		}()
	}
	wg.Wait()
	<-producing
	fo.settle(t)
	var read []float64
	for _, m := range metrics {
		read = append(read, testutil.ToFloat64(m.CatchUp.WithLabelValues("stored")))
	}
	t.Logf("events stored by each relay's catch-up: %v", read)
	if read[0]+read[1] < 3800 || read[0] != 0 && read[1] != 0 {
		t.Errorf("the catch-ups stored %v events, want one relay to store the 3800 or more", read)
	}
}

// A relay is SIGKILLed in the middle of a large catch-up after a
// failover, and another starts: it resumes where the first had got to,
// and the stream ends up with every event once, in order.
func TestFailoverCatchUpKilledMidwayResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("a large catch-up")
	}
	// Its own Postgres primary and standby and its own NATS server:
	// nothing shared with the other tests.
	t.Parallel()
	const relayed, total = 100, 10000
	fo := failOver(t, relayed, func(f *fixture) { f.write(t, relayed, total, 1) })
	g := fo.fresh
	cs := newRelayChildren(t)
	first := cs.start(t, g, "first", g.nats.URL, 0)
	// The children relay the default slot: the one the relay used is
	// gone with the old primary, so this is no different from a new one.
	testenv.Eventually(t, "the catch-up to be under way", 60*time.Second, func() bool {
		n := streamMsgs(t, g.js)
		return n > relayed+1000
	})
	first.sigkill(t)
	at := streamMsgs(t, g.js)
	t.Logf("killed with %d of %d events in the stream", at, total)
	if at >= total {
		t.Fatalf("the catch-up had finished (%d events) before the kill: make the outbox larger", at)
	}
	second := cs.start(t, g, "second", g.nats.URL, 0)
	fo.settle(t)
	if !strings.Contains(second.out.String(), "resuming the catch-up") {
		t.Errorf("the second relay did not resume the first's catch-up:\n%s", lastBytes(second.out.String(), 3000))
	}
}

// Logical decoding hands the relay a commit once the primary flushed it,
// while the synchronous standby has not confirmed it yet (its writer is
// still waiting). The standby is down, the primary dies, the standby is
// promoted without the commit: the relay must not have published it. A
// different write of the same document and version on the new primary is
// then the one the stream holds.
func TestUnconfirmedCommitIsNotPublished(t *testing.T) {
	ctx := context.Background()
	primary, standby := startPrimaryAndStandby(t)
	f := newFixtureOn(t, primary.URL("converge"))
	metrics := relay.NewMetrics(nil)
	runRelay(t, f.nats.Connect(t), f.dbURL, fastRelay(failoverSlot), metrics)
	waitSlotActive(t, f.pool, failoverSlot)
	f.write(t, 0, 100, 1)
	testenv.Eventually(t, "the first events relayed", 30*time.Second, func() bool { return streamMsgs(t, f.js) == 100 })
	testenv.Eventually(t, "the relay to publish once standbys confirmed", 10*time.Second, func() bool { return testutil.ToFloat64(metrics.Gated) == 1 })

	if err := standby.StopKeep(ctx); err != nil {
		t.Fatal(err)
	}
	unconfirmed := contract.Document{Key: "unconfirmed", Version: 1, Title: "t", Body: "the old primary's"}
	writeCtx, cancelWrite := context.WithCancel(ctx)
	defer cancelWrite()
	wrote := make(chan error, 1)
	go func() {
		outs, err := f.store.Apply(writeCtx, []docstore.Write{{Doc: unconfirmed}})
		if err == nil && len(outs) == 1 {
			err = outs[0].Err
		}
		wrote <- err
	}()
	// Committed on the primary, flushed, decoded: the relay has it.
	testenv.Eventually(t, "the commit to be flushed on the primary", 10*time.Second, func() bool {
		var n int
		_ = f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		return n == 1
	})
	time.Sleep(2 * time.Second)
	if n := streamMsgs(t, f.js); n != 100 {
		t.Errorf("the stream holds %d events while the 101st waits for the standby, want 100", n)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err == nil {
		t.Fatal("the write waiting for the standby succeeded though the primary died")
	}
	if err := standby.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	g := newFixtureWith(t, standby.URL("converge"), f.nats)
	var n int
	if err := g.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE key = 'unconfirmed'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the promoted standby has %d rows of the unconfirmed write (%v), want none", n, err)
	}
	// The same document and version, written anew: another event of the
	// same id, which the stream must hold as written here.
	now := contract.Document{Key: "unconfirmed", Version: 1, Title: "t", Body: "the new primary's"}
	if _, err := g.store.Apply(ctx, []docstore.Write{{Doc: now}}); err != nil {
		t.Fatal(err)
	}
	runRelay(t, f.nats.Connect(t), g.dbURL, fastRelay(failoverSlot), nil)
	fo := failedOver{old: f, fresh: g, standby: standby}
	fo.settle(t)
	s, err := g.js.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, contract.Subject("unconfirmed"))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := contract.DecodeEvent(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	var payload string
	if err := g.pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE key = 'unconfirmed'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != payload {
		t.Errorf("the stream holds %s (content hash %s), the new primary %s", m.Data, ev.ContentHash, payload)
	}
}
