//go:build linux

package relay_test

// These tests restart the shared Postgres cluster or a NATS server under a
// running relay, so none of them runs in parallel; each leaves the cluster
// running. They are Linux-only because the memory test reads /proc and ties
// its relay process to the test binary with Pdeathsig.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// fastRelay reconnects and confirms quickly, so an outage and its recovery
// fit in a few seconds of test time.
func fastRelay(slot string) relay.Config {
	return relay.Config{
		Slot:              slot,
		Window:            256,
		StatusInterval:    200 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond,
		LagCheckInterval:  200 * time.Millisecond,
		StandbyRetry:      100 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
	}
}

// runRelay runs a relay in-process until the test ends; its log is shown
// if the test fails.
func runRelay(t *testing.T, nc *nats.Conn, dbURL string, cfg relay.Config, metrics *relay.Metrics) *relay.Relay {
	t.Helper()
	r, _ := runRelayLogged(t, nc, dbURL, cfg, metrics)
	return r
}

// runRelayLogged is runRelay, and the relay's log as it goes.
func runRelayLogged(t *testing.T, nc *nats.Conn, dbURL string, cfg relay.Config, metrics *relay.Metrics) (*relay.Relay, *testenv.LockedBuffer) {
	t.Helper()
	cfg.PostgresURL = dbURL
	// Every version stays in the stream, so it can be compared with the
	// outbox event by event.
	cfg.Stream.MaxMsgsPerSubject = -1
	logs := &testenv.LockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", logs)
		}
	})
	r, err := relay.New(nc, cfg, metrics, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r, logs
}

func waitSlotActive(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Helper()
	testenv.Eventually(t, "slot "+slot+" to be active", 20*time.Second, func() bool {
		var active bool
		err := pool.QueryRow(context.Background(),
			// Held while being created too, and while the relay catches up
			// from the outbox: wait until its walsender streams.
			`SELECT active AND confirmed_flush_lsn IS NOT NULL AND EXISTS (SELECT FROM pg_stat_replication r WHERE r.pid = s.active_pid AND r.state IN ('catchup', 'streaming'))
			FROM pg_replication_slots s WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&active)
		return err == nil && active
	})
}

// slotPosition returns the slot's confirmed_flush_lsn and the server's
// current WAL position, as byte offsets read in one snapshot.
func slotPosition(t *testing.T, pool *pgxpool.Pool, slot string) (confirmed, current int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `
		SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::int8, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&confirmed, &current)
	if err != nil {
		t.Fatalf("read slot %s: %v", slot, err)
	}
	return confirmed, current
}

// waitConfirmedPastNow waits until the slot has confirmed every transaction
// committed so far: only then has JetStream acknowledged all their events.
func waitConfirmedPastNow(t *testing.T, pool *pgxpool.Pool, slot string, timeout time.Duration) {
	t.Helper()
	_, now := slotPosition(t, pool, slot)
	testenv.Eventually(t, "the slot to confirm everything committed", timeout, func() bool {
		c, _ := slotPosition(t, pool, slot)
		return c >= now
	})
}

func outboxCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// churn writes batches of the same keys, each batch a new version of every
// key, until halted. A batch that fails is retried until it succeeds: when
// the connection died mid-commit its outcome is unknown, and the retry finds
// it either missing (applied now) or already stored (unchanged).
type churn struct {
	store *docstore.Store
	keys  int

	stop, done chan struct{}
	once       sync.Once

	batches   atomic.Int64 // batches committed
	failures  atomic.Int64 // attempts that returned an error
	recovered atomic.Int64 // batches whose retry found them already committed
}

func startChurn(t *testing.T, store *docstore.Store, keys int) *churn {
	w := &churn{store: store, keys: keys, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(t)
	t.Cleanup(w.halt)
	return w
}

// halt stops after the batch in progress has succeeded.
func (w *churn) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

func (w *churn) run(t *testing.T) {
	defer close(w.done)
	for version := int64(1); ; version++ {
		select {
		case <-w.stop:
			return
		default:
		}
		writes := make([]docstore.Write, w.keys)
		for i := range writes {
			key := fmt.Sprintf("churn-%d", i)
			writes[i] = docstore.Write{Doc: contract.Document{Key: key, Version: version, Title: "t",
				Body: fmt.Sprintf("%s at version %d", key, version)}}
		}
		var failingSince time.Time
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			outs, err := w.store.Apply(ctx, writes)
			cancel()
			if err != nil {
				w.failures.Add(1)
				if failingSince.IsZero() {
					failingSince = time.Now()
				} else if time.Since(failingSince) > time.Minute {
					t.Errorf("batch at version %d still failing after a minute: %v", version, err)
					return
				}
				time.Sleep(25 * time.Millisecond)
				continue
			}
			results := map[docstore.Result]int{}
			for _, o := range outs {
				if o.Err != nil {
					t.Errorf("write %s v%d: %v", o.Key, o.Version, o.Err)
					return
				}
				results[o.Result]++
			}
			switch {
			case results[docstore.Applied] == len(outs):
			case results[docstore.Unchanged] == len(outs) && attempt > 0:
				w.recovered.Add(1)
			default:
				// A batch is one transaction; only a retry may find it stored.
				t.Errorf("batch at version %d, attempt %d: outcomes %v", version, attempt, results)
				return
			}
			w.batches.Add(1)
			break
		}
	}
}

// storedEvents reads the whole stream and counts its messages by
// Nats-Msg-Id, checking that each is the valid event its id and subject
// claim.
func storedEvents(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ids := map[string]int{}
	// The relay publishes in commit order: of each document, the first
	// copy of every version is stored after the older versions' (a message
	// lost with a NATS connection, then published again after newer ones
	// reached the new server, breaks it).
	newest := map[string]int64{}
	outOfOrder := 0
	readStream(t, js, func(m jetstream.Msg, ev contract.Event) {
		id := m.Headers().Get(jetstream.MsgIDHeader)
		if ev.ID.String() != id || m.Subject() != contract.Subject(ev.Key) {
			t.Fatalf("message on %s with id %s holds event %s of %s", m.Subject(), id, ev.ID, ev.Key)
		}
		if ids[id] == 0 {
			if ev.Version < newest[ev.Key] {
				outOfOrder++
				if outOfOrder <= 5 {
					t.Errorf("%s: version %d stored after version %d", ev.Key, ev.Version, newest[ev.Key])
				}
			}
			newest[ev.Key] = max(newest[ev.Key], ev.Version)
		}
		ids[id]++
	})
	if outOfOrder > 0 {
		t.Errorf("%d events stored after a newer version of their document", outOfOrder)
	}
	return ids
}

// readStream reads the documents' stream from its first message to the
// last it holds now, passing each message and its event to each.
func readStream(t *testing.T, js jetstream.JetStream, each func(jetstream.Msg, contract.Event)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	total := int(info.State.Msgs)
	for read := 0; read < total; {
		// Ask for no more than remains, so the last fetch does not wait out
		// its expiry.
		batch, err := c.Fetch(min(1000, total-read), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			ev, err := contract.DecodeEvent(m.Data())
			if err != nil {
				t.Fatalf("message %s does not decode: %v", m.Headers().Get(jetstream.MsgIDHeader), err)
			}
			each(m, ev)
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("read stream after %d of %d messages: %v", read, total, err)
		}
		if got == 0 {
			t.Fatalf("stream read stalled after %d of %d messages", read, total)
		}
		read += got
	}
}

// compareWithOutbox fails the test unless the stream holds every outbox
// event exactly once and nothing else; it returns the number of outbox
// events and of surplus copies stored.
func compareWithOutbox(t *testing.T, pool *pgxpool.Pool, stored map[string]int) (events, surplus int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	outbox, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	inOutbox := make(map[string]bool, len(outbox))
	var missing, extra, duplicates []string
	for _, id := range outbox {
		inOutbox[id] = true
		if stored[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, n := range stored {
		if !inOutbox[id] {
			extra = append(extra, id)
		}
		if n > 1 {
			duplicates = append(duplicates, fmt.Sprintf("%s x%d", id, n))
			surplus += n - 1
		}
	}
	first := func(s []string) []string { return s[:min(len(s), 5)] }
	if len(missing) > 0 {
		t.Errorf("%d of %d outbox events are not in the stream, e.g. %v", len(missing), len(outbox), first(missing))
	}
	if len(extra) > 0 {
		t.Errorf("%d stream events are not in the outbox, e.g. %v", len(extra), first(extra))
	}
	if len(duplicates) > 0 {
		t.Errorf("%d events are stored more than once, e.g. %v", len(duplicates), first(duplicates))
	}
	return len(outbox), surplus
}

// Postgres crashes (immediate shutdown, then crash recovery) while a writer
// and the relay are busy. The relay must reconnect by itself and resume from
// the slot; the slot's position is only saved at checkpoints, so after the
// crash it resends transactions already confirmed, and the stream's
// duplicate window must drop them.
func TestPostgresRestartMidStream(t *testing.T) {
	f := newFixture(t)
	const slot = "restart_pg"
	metrics := relay.NewMetrics(nil)
	r := runRelay(t, f.nats.Connect(t), f.dbURL, fastRelay(slot), metrics)
	waitSlotActive(t, f.pool, slot)

	w := startChurn(t, f.store, 20)
	testenv.Eventually(t, "the relay to be mid-stream", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 1000 })

	// Whatever happens below, the shared cluster must be running again for
	// the tests that follow.
	var killed, restarted bool
	t.Cleanup(func() {
		if killed && !restarted {
			if err := pg.Cluster.Restart(context.Background()); err != nil {
				t.Errorf("restart postgres: %v", err)
			}
		}
	})
	beforeCrash := streamMsgs(t, f.js)
	if err := pg.Cluster.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	down := time.Now()
	// The writer and the relay hit the dead server before it comes back.
	testenv.Eventually(t, "a failed write and a lost replication session", 10*time.Second, func() bool {
		return w.failures.Load() > 0 && testutil.ToFloat64(metrics.SessionErrors.WithLabelValues("postgres")) > 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := pg.Cluster.Restart(ctx)
	cancel()
	if err != nil {
		t.Fatalf("restart postgres: %v", err)
	}
	restarted = true
	t.Logf("postgres down for %v (crash recovery included)", time.Since(down).Round(time.Millisecond))

	// Keep writing well past the restart, then let the relay catch up.
	batchesAtRestart := w.batches.Load()
	testenv.Eventually(t, "writes after the restart", 30*time.Second, func() bool { return w.batches.Load() >= batchesAtRestart+30 })
	testenv.Eventually(t, "events after the restart", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= beforeCrash+1000 })
	w.halt()
	waitConfirmedPastNow(t, f.pool, slot, 30*time.Second)

	if w.failures.Load() == 0 {
		t.Fatal("no write failed: the crash did not happen mid-stream")
	}
	events, surplus := compareWithOutbox(t, f.pool, storedEvents(t, f.js))
	sessionErrors := testutil.ToFloat64(metrics.SessionErrors.WithLabelValues("postgres"))
	if sessionErrors == 0 {
		t.Error("the relay never lost its replication session")
	}
	if !r.Active() {
		t.Error("the relay does not hold the slot after the restart")
	}
	t.Logf("%d events (%d in the stream at the crash), %d stored duplicates; %v resent by the slot and not published again (the recorded position), "+
		"%v republished after the crash and dropped by the duplicate window; "+
		"%d failed write attempts, %d batches found already committed on retry; %v replication sessions lost",
		events, beforeCrash, surplus, testutil.ToFloat64(metrics.Skipped), testutil.ToFloat64(metrics.Duplicates), w.failures.Load(), w.recovered.Load(), sessionErrors)
}

// The NATS server (file store) restarts on the same port and store while
// the writer keeps writing. Publishes awaiting an acknowledgement fail when
// the connection drops; the relay must resume from what it confirmed, and
// nothing may be lost or stored twice.
func TestNATSRestartMidStream(t *testing.T) {
	// outageBatches are written while the server is down: events the relay
	// must publish once it is back.
	const outageBatches = 50
	f := newFixture(t)
	const slot = "restart_nats"
	n, err := testenv.StartNATSAt(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	current := n
	t.Cleanup(func() { current.Shutdown() })
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(n.URL, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	js, err := jetstream.New(connect("test"))
	if err != nil {
		t.Fatal(err)
	}
	metrics := relay.NewMetrics(nil)
	r := runRelay(t, connect("relay"), f.dbURL, fastRelay(slot), metrics)
	waitSlotActive(t, f.pool, slot)

	w := startChurn(t, f.store, 20)
	testenv.Eventually(t, "the relay to be mid-stream", 30*time.Second, func() bool { return streamMsgs(t, js) >= 1000 })

	beforeOutage := streamMsgs(t, js)
	n.Shutdown()
	batchesAtShutdown := w.batches.Load()
	// Writes continue; the relay cannot publish them.
	testenv.Eventually(t, "batches written during the outage", 10*time.Second, func() bool {
		return w.batches.Load() >= batchesAtShutdown+outageBatches
	})
	writtenDuringOutage := w.batches.Load() - batchesAtShutdown
	restarted, err := testenv.StartNATSAt(n.StoreDir, n.Port)
	if err != nil {
		t.Fatalf("restart NATS: %v", err)
	}
	current = restarted
	if writtenDuringOutage == 0 {
		t.Fatal("no batch was written during the outage")
	}

	testenv.Eventually(t, "events after the restart", 30*time.Second, func() bool { return streamMsgs(t, js) >= beforeOutage+1000 })
	w.halt()
	waitConfirmedPastNow(t, f.pool, slot, 30*time.Second)

	events, surplus := compareWithOutbox(t, f.pool, storedEvents(t, js))
	if !r.Active() {
		t.Error("the relay does not hold the slot after the restart")
	}
	t.Logf("%d events (%d in the stream at shutdown, %d batches written during the outage), %d stored duplicates; "+
		"%v republished and dropped by the duplicate window; %v replication sessions ended by a publish error",
		events, beforeOutage, writtenDuringOutage, surplus, testutil.ToFloat64(metrics.Duplicates),
		testutil.ToFloat64(metrics.SessionErrors.WithLabelValues("publish")))
}

// With no outbox writes at all, the slot must not pin WAL: unrelated WAL
// (a table outside the publication) and, on a fully idle database, the
// heartbeats themselves let the relay confirm ever later positions.
func TestIdleHeartbeatAdvancesSlot(t *testing.T) {
	f := newFixture(t)
	const slot = "idle_heartbeat"
	metrics := relay.NewMetrics(nil)
	r := runRelay(t, f.nats.Connect(t), f.dbURL, fastRelay(slot), metrics)
	waitSlotActive(t, f.pool, slot)
	ctx := context.Background()

	// Autovacuum stays off the noise table, so the idle phase below is idle.
	if _, err := f.pool.Exec(ctx, `CREATE TABLE noise (id int8, pad text) WITH (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	startConfirmed, startWAL := slotPosition(t, f.pool, slot)
	var (
		advances     int
		lastSeen     = startConfirmed
		maxLag       int64
		maxLagGauge  float64
		statements   int
		noiseStarted = time.Now()
	)
	for time.Since(noiseStarted) < 3*time.Second {
		if _, err := f.pool.Exec(ctx, `INSERT INTO noise SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, 2000) g`); err != nil {
			t.Fatal(err)
		}
		statements++
		c, now := slotPosition(t, f.pool, slot)
		if c > lastSeen {
			advances++
			lastSeen = c
		}
		maxLag = max(maxLag, now-c)
		maxLagGauge = max(maxLagGauge, testutil.ToFloat64(metrics.SlotLagBytes))
	}
	_, noiseEnd := slotPosition(t, f.pool, slot)
	noiseWAL := noiseEnd - startWAL
	testenv.Eventually(t, "the slot to confirm past the noise", 10*time.Second, func() bool {
		c, _ := slotPosition(t, f.pool, slot)
		return c >= noiseEnd
	})
	t.Logf("noise: %d statements, %d KiB of WAL in %v; confirmed_flush_lsn advanced %d times while it ran; max lag %d KiB (relay's gauge: max %.0f KiB)",
		statements, noiseWAL>>10, time.Since(noiseStarted).Round(time.Millisecond), advances, maxLag>>10, maxLagGauge/1024)
	if advances < 3 {
		t.Errorf("confirmed_flush_lsn advanced only %d times during 3 s of unrelated WAL", advances)
	}
	// Without confirmation the lag would grow to all of the noise; with it,
	// it stays near what a few status intervals produce.
	if maxLag > noiseWAL/2 {
		t.Errorf("slot lag reached %d bytes of %d bytes of noise WAL", maxLag, noiseWAL)
	}
	if maxLagGauge == 0 || int64(maxLagGauge) > noiseWAL/2 {
		t.Errorf("the relay's slot lag gauge peaked at %.0f bytes of %d bytes of noise WAL", maxLagGauge, noiseWAL)
	}

	// Fully idle: nothing writes but the relay's own heartbeats.
	idleConfirmed, idleWAL := slotPosition(t, f.pool, slot)
	idleStart := time.Now()
	var endConfirmed, endWAL int64
	testenv.Eventually(t, "heartbeats to grow the WAL and the slot to confirm past where it was", 10*time.Second, func() bool {
		endConfirmed, endWAL = slotPosition(t, f.pool, slot)
		return endWAL > idleWAL && endConfirmed > idleConfirmed && endConfirmed >= idleWAL
	})
	t.Logf("idle: WAL grew %d bytes in %v; confirmed_flush_lsn advanced %d bytes; lag at the end %d bytes (relay's gauge %.0f)",
		endWAL-idleWAL, time.Since(idleStart).Round(time.Millisecond), endConfirmed-idleConfirmed, endWAL-endConfirmed, testutil.ToFloat64(metrics.SlotLagBytes))
	if endWAL <= idleWAL {
		t.Error("no WAL at all while idle: the heartbeats are not being written")
	}
	if endConfirmed <= idleConfirmed || endConfirmed < idleWAL {
		t.Errorf("confirmed_flush_lsn went from %d to %d on an idle database whose WAL reached %d", idleConfirmed, endConfirmed, idleWAL)
	}
	if lag := endWAL - endConfirmed; lag > 64<<10 {
		t.Errorf("slot lag on an idle database is %d bytes", lag)
	}
	if uint64(r.ConfirmedLSN()) == 0 {
		t.Error("the relay reports no confirmed position")
	}
	if n := outboxCount(t, f.pool); n != 0 {
		t.Fatalf("the outbox holds %d rows; this test writes none", n)
	}
	if n := streamMsgs(t, f.js); n != 0 {
		t.Errorf("the stream holds %d messages, yet the outbox was never written", n)
	}
}

// One transaction of 50,000 outbox rows (about 50 MB) is relayed by a relay
// running as its own process with a window of 256. Its resident memory must
// stay far below the transaction's size: it holds at most the window, never
// the transaction.
func TestLargeTransactionBoundedMemory(t *testing.T) {
	const (
		events = 50_000
		window = 256
		// The race detector's shadow memory multiplies the heap, so the main
		// bound is on growth over the idle relay (about 20 MiB with -race,
		// 8 MiB without): holding the transaction's 50 MB of payload would
		// exceed it several times over. The absolute bound allows for the
		// race runtime's own footprint (an idle relay: about 45 MiB).
		maxGrowth = 40 << 20
		maxPeak   = 150 << 20
	)
	f := newFixture(t)

	child := startChildRelay(t, f.dbURL, f.nats.URL, window)
	// Built while the relay starts up, before its baseline is taken.
	rows, payloadBytes := largeTransaction(t, events)
	waitSlotActive(t, f.pool, "converge_relay")
	// Past start-up: its session runs, over both connections and the stream.
	testenv.Eventually(t, "the relay process to log its session", 10*time.Second, func() bool {
		return strings.Contains(child.out.String(), "msg=relaying")
	})
	baseline, err := procStatusBytes(child.pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	sampler := sampleRSS(child.pid, 10*time.Millisecond)

	start := time.Now()
	// COPY is one statement, so the rows are one transaction.
	n, err := f.pool.CopyFrom(context.Background(), pgx.Identifier{"outbox"},
		[]string{"event_id", "key", "version", "kind", "payload"}, pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatal(err)
	}
	if n != events {
		t.Fatalf("copied %d rows, want %d", n, events)
	}
	committed := time.Since(start)
	testenv.Eventually(t, "all events in the stream", 2*time.Minute, func() bool {
		if !child.running() {
			t.Fatal("the relay process exited")
		}
		return streamMsgs(t, f.js) >= events
	})
	relayed := time.Since(start)
	hwm, err := procStatusBytes(child.pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	sampled, samples := sampler.halt()
	peak := max(hwm, sampled)

	s, err := f.js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Each key has exactly one event on its own subject: as many messages as
	// subjects, and as many subjects as events, means each event once.
	if info.State.Msgs != events || info.State.NumSubjects != events {
		t.Errorf("the stream holds %d messages on %d subjects, want %d on %d", info.State.Msgs, info.State.NumSubjects, events, events)
	}
	for _, seq := range []uint64{1, events / 2, events} {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := contract.DecodeEvent(m.Data); err != nil {
			t.Fatalf("message %d does not decode: %v", seq, err)
		}
	}
	waitConfirmedPastNow(t, f.pool, "converge_relay", 20*time.Second)
	// One session throughout: the transaction neither broke the replication
	// connection nor made publishes time out.
	if n := strings.Count(child.out.String(), "replication session ended"); n > 0 {
		t.Errorf("the relay lost its session %d times while relaying", n)
	}

	t.Logf("%d events, %d MiB of payload in one transaction (committed in %v), relayed in %v (%.0f events/s)",
		events, payloadBytes>>20, committed.Round(time.Millisecond), relayed.Round(time.Millisecond), float64(events)/relayed.Seconds())
	t.Logf("relay process RSS: baseline %.1f MiB, peak %.1f MiB (VmHWM %.1f MiB, sampled max %.1f MiB over %d samples), growth %.1f MiB",
		mib(baseline), mib(peak), mib(hwm), mib(sampled), samples, mib(peak-baseline))
	if peak-baseline > maxGrowth {
		t.Errorf("relay RSS grew %.1f MiB while relaying a %d MiB transaction; bound %d MiB", mib(peak-baseline), payloadBytes>>20, maxGrowth>>20)
	}
	if peak > maxPeak {
		t.Errorf("relay peak RSS %.1f MiB; bound %d MiB", mib(peak), maxPeak>>20)
	}
}

// largeTransaction builds the outbox rows of n documents, each with a valid
// event of about 1 KB, spread over the CPUs because the race detector makes
// hashing and encoding slow.
func largeTransaction(t *testing.T, n int) (rows [][]any, payloadBytes int) {
	t.Helper()
	rows = make([][]any, n)
	filler := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 13)
	docs := corpus.Sequential(n, corpus.Shape{Keys: "large-%05d", Title: corpus.Fixed("large transaction"),
		Body: func(i int) string { return fmt.Sprintf("document %d. %s", i, filler) }})
	var (
		total   atomic.Int64
		wg      sync.WaitGroup
		workers = runtime.GOMAXPROCS(0)
	)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				d := docs[i]
				ev := contract.NewUpsertedEvent(d, []string{d.Body})
				payload, err := ev.Encode()
				if err != nil {
					t.Error(err)
					return
				}
				total.Add(int64(len(payload)))
				rows[i] = []any{ev.ID, ev.Key, ev.Version, string(ev.Kind), payload}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return rows, int(total.Load())
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// relayProcess is a relay running as its own process: the test binary in
// child mode (see runChild).
type relayProcess struct {
	pid    int
	exited chan struct{} // closed when the process has exited
	out    *testenv.LockedBuffer
}

func (p *relayProcess) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// startChildRelay starts a relay process and stops it, gracefully if it
// can, when the test ends.
func startChildRelay(t *testing.T, dbURL, natsURL string, window int) *relayProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "CONVERGE_POSTGRES_URL="+dbURL,
		"CONVERGE_NATS_URL="+natsURL, "CONVERGE_RELAY_WINDOW="+strconv.Itoa(window),
		// Under the race detector, shadow memory grows with the heap the
		// collector lets grow; the default GOGC keeps this measurement about
		// what the relay buffers.
		"CONVERGE_RELAY_GOGC=100")
	p := &relayProcess{exited: make(chan struct{}), out: &testenv.LockedBuffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// Dies with the test binary, even if that is killed before its cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.pid = cmd.Process.Pid
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if !p.running() {
			t.Errorf("relay process exited before the test ended: %v", waitErr)
		} else {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
				if waitErr != nil {
					t.Errorf("relay process: %v", waitErr)
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-p.exited
				t.Error("relay process did not stop within 15s of SIGTERM")
			}
		}
		if t.Failed() {
			t.Logf("relay process output:\n%s", p.out)
		}
	})
	return p
}

// rssSampler records the highest VmRSS of a process.
type rssSampler struct {
	stop    chan struct{}
	done    chan struct{}
	peak    int64
	samples int
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if rss, err := procStatusBytes(pid, "VmRSS"); err == nil {
				s.peak = max(s.peak, rss)
				s.samples++
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) halt() (peak int64, samples int) {
	close(s.stop)
	<-s.done
	return s.peak, s.samples
}
