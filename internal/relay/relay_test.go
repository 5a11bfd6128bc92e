package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
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

var pg *testenv.Postgres

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	os.Exit(testenv.RunMain(m, &pg))
}

// childEnv makes the test binary run a relay instead of the tests, so crash
// tests can start it as a real process and SIGKILL it. The child reads
// CONVERGE_POSTGRES_URL and CONVERGE_NATS_URL, and CONVERGE_RELAY_WINDOW,
// CONVERGE_RELAY_STREAM_HISTORY (the stream's messages per subject; default
// -1, all), CONVERGE_RELAY_GOGC and CONVERGE_RELAY_CPUPROFILE (a file to
// write a CPU profile of the child to) when set.
const childEnv = "CONVERGE_RELAY_TEST_CHILD"

func runChild() int {
	// cmd/relay's defaults, unless the test asks otherwise.
	gogc, limit := 300, int64(48<<20)
	if v, err := strconv.Atoi(os.Getenv("CONVERGE_RELAY_GOGC")); err == nil {
		gogc, limit = v, 0
	}
	relay.TuneGC(gogc, limit)
	if path := os.Getenv("CONVERGE_RELAY_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child relay:", err)
			return 2
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "child relay:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(os.Getenv("CONVERGE_NATS_URL"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 2
	}
	defer nc.Close()
	window, _ := strconv.Atoi(os.Getenv("CONVERGE_RELAY_WINDOW"))
	history := int64(-1)
	if v, err := strconv.ParseInt(os.Getenv("CONVERGE_RELAY_STREAM_HISTORY"), 10, 64); err == nil {
		history = v
	}
	cfg := relay.Config{PostgresURL: os.Getenv("CONVERGE_POSTGRES_URL"), Window: window,
		StandbyRetry: 200 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		Stream: relay.StreamConfig{MaxMsgsPerSubject: history}}
	cfg.Effects.Enabled, _ = strconv.ParseBool(os.Getenv("CONVERGE_RELAY_EFFECTS"))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := relay.New(nc, cfg, nil, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	return 0
}

type fixture struct {
	stops []func()
	dbURL string
	pool  *pgxpool.Pool
	store *docstore.Store
	nats  *testenv.NATS
	js    jetstream.JetStream
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, pg.MigratedDatabase(t))
}

// newFixtureOn is a fixture over the database at url, whose schema the
// caller prepared.
func newFixtureOn(t *testing.T, url string) *fixture {
	t.Helper()
	return newFixtureWith(t, url, testenv.StartNATS(t))
}

// newFixtureWith is a fixture over the database at url and the NATS
// server n (another fixture's: a relay moved to a new primary).
func newFixtureWith(t *testing.T, url string, n *testenv.NATS) *fixture {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	// The slot must go before the database can be dropped.
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
	})
	return &fixture{dbURL: url, pool: pool, store: store, nats: n, js: js}
}

func (f *fixture) startRelay(t *testing.T, cfg relay.Config) (stop func()) {
	t.Helper()
	cfg.PostgresURL = f.dbURL
	if cfg.Stream.MaxMsgsPerSubject == 0 {
		cfg.Stream.MaxMsgsPerSubject = -1
	}
	r, err := relay.New(f.nats.Connect(t), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := r.Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				// A hang here is a bug in shutdown: fail now, with every
				// goroutine's stack, rather than at the package timeout.
				panic("relay did not stop within a minute of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	f.stops = append(f.stops, stop)
	return stop
}

// stopAll stops every relay the fixture started.
func (f *fixture) stopAll(t *testing.T) {
	t.Helper()
	for _, stop := range f.stops {
		stop()
	}
}

func (f *fixture) write(t *testing.T, from, to int, version int64) {
	t.Helper()
	docs := corpus.Sequential(to-from, corpus.Shape{First: from, Version: version, Title: corpus.Fixed("t"),
		Body: func(i int) string { return fmt.Sprintf("body %d at %d", i, version) }})
	var writes []docstore.Write
	for i, d := range docs {
		writes = append(writes, docstore.Write{Doc: d})
		if len(writes) == 100 || i == len(docs)-1 {
			outs, err := f.store.Apply(context.Background(), writes)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				if o.Err != nil || o.Result != docstore.Applied {
					t.Fatalf("write %s: %v %v", o.Key, o.Result, o.Err)
				}
			}
			writes = writes[:0]
		}
	}
}

// swallow subscribes to subject on a connection of its own and answers
// nothing: what is published there is lost, unacknowledged. The server
// knows the subscriber when swallow returns.
func (f *fixture) swallow(t *testing.T, subject string) {
	t.Helper()
	nc := f.nats.Connect(t)
	sub, err := nc.Subscribe(subject, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func streamMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestRelayPublishesEveryEventOnceAndConfirms(t *testing.T) {
	f := newFixture(t)
	f.write(t, 0, 500, 1) // before the slot exists: the relay catches up from the outbox
	stop := f.startRelay(t, relay.Config{})
	f.waitSlot(t)
	f.write(t, 0, 1000, 2)
	testenv.Eventually(t, "1500 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 1500 })

	s, _ := f.js.Stream(context.Background(), contract.DocsStream)
	for seq := uint64(501); seq <= 1500; seq += 97 {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := contract.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("message %d does not decode: %v", seq, err)
		}
		if m.Subject != contract.Subject(ev.Key) || m.Header.Get("Nats-Msg-Id") != ev.ID.String() || ev.Version != 2 {
			t.Fatalf("message %d: subject %s id %s event %s v%d", seq, m.Subject, m.Header.Get("Nats-Msg-Id"), ev.ID, ev.Version)
		}
		if _, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime)); err != nil {
			t.Fatalf("commit time header: %v", err)
		}
	}
	// Everything acknowledged is confirmed: the slot reaches the last commit.
	var current string
	_ = f.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&current)
	testenv.Eventually(t, "confirmed_flush_lsn to pass the last commit", 10*time.Second, func() bool {
		var ok bool
		_ = f.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'converge_relay'`, current).Scan(&ok)
		return ok
	})
	stop()

	// A restart resumes after the confirmed position: nothing republished.
	// Once the slot confirms past the new writes, everything before them
	// that the relay would republish has been published.
	f.startRelay(t, relay.Config{StatusInterval: 50 * time.Millisecond})
	f.write(t, 0, 10, 3)
	testenv.Eventually(t, "10 more events", 20*time.Second, func() bool { return streamMsgs(t, f.js) >= 1510 })
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	if n := streamMsgs(t, f.js); n != 1510 {
		t.Fatalf("stream holds %d messages, want 1510", n)
	}
}

// On shutdown the relay waits for outstanding acknowledgements and confirms
// them before closing, so a restart has nothing to republish. Without the
// final status update, the restarted relay would resend everything after the
// last periodic update and JetStream would report duplicates.
func TestGracefulShutdownConfirmsEverythingAcknowledged(t *testing.T) {
	f := newFixture(t)
	cfg := relay.Config{StatusInterval: time.Hour, HeartbeatInterval: -1} // no periodic confirmation
	stop := f.startRelay(t, cfg)
	f.waitSlot(t)
	f.write(t, 0, 3000, 1)
	stop() // may be mid-stream: whatever was acknowledged must be confirmed
	published := streamMsgs(t, f.js)

	metrics := relay.NewMetrics(nil)
	_, stop = f.runWith(t, relay.Config{Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}}, metrics, nil)
	testenv.Eventually(t, "all 3000 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 3000 })
	// The relay counts acknowledgements in publish order, which is commit
	// order: once it has counted one for each event missing at shutdown,
	// any event it republished (all older) has been counted too.
	testenv.Eventually(t, "the relay to count the acknowledgements of the missing events", 20*time.Second, func() bool {
		return testutil.ToFloat64(metrics.Published) >= float64(3000-published)
	})
	stop()
	if d := testutil.ToFloat64(metrics.Duplicates); d != 0 {
		t.Fatalf("restart republished %v events already acknowledged before shutdown (%d were in the stream at shutdown)", d, published)
	}
	if got := testutil.ToFloat64(metrics.Published); got != float64(3000-published) {
		t.Fatalf("restart published %v events, want the %d not yet relayed", got, 3000-published)
	}
	t.Logf("%d events relayed before shutdown, %d after restart, 0 republished", published, 3000-published)
}

// The relay reports the slot's position from the start of a session, before
// anything new is confirmed.
func TestConfirmedLSNReportedFromSlotAtStart(t *testing.T) {
	f := newFixture(t)
	f.startRelay(t, relay.Config{StatusInterval: 50 * time.Millisecond}) // creates the slot
	f.waitSlot(t)
	f.write(t, 0, 10, 1)
	testenv.Eventually(t, "10 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 10 })
	// The slot holds a position past the events, confirmed by this relay,
	// before it stops.
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	f.stopAll(t)
	var slotLSN string
	_ = f.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'converge_relay'`).Scan(&slotLSN)

	r, stop := f.runWith(t, relay.Config{HeartbeatInterval: -1, Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}}, nil, nil)
	testenv.Eventually(t, "the relay to be active", 10*time.Second, r.Active)
	// A keepalive may already have moved it on (nothing is in flight), but
	// never from anything below the slot's position.
	want, err := pglogrepl.ParseLSN(slotLSN)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.ConfirmedLSN(); got < want {
		t.Errorf("relay reports %s at start, the slot holds %s", got, slotLSN)
	}
	stop()
}

// Slot names are cluster-wide: a relay pointed at a database whose slot name
// is taken by another database must say so and stop, not retry forever.
func TestSlotOfAnotherDatabaseIsAConfigurationError(t *testing.T) {
	f := newFixture(t)
	other := pg.MigratedDatabase(t)
	conn, err := pgxpool.New(context.Background(), other)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Exec(context.Background(), `SELECT pg_create_logical_replication_slot('converge_relay', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_drop_replication_slot('converge_relay')`) }()
	r, err := relay.New(f.nats.Connect(t), relay.Config{PostgresURL: f.dbURL}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "belongs to database") {
		t.Fatalf("Run = %v, want a configuration error naming the other database", err)
	}
}

// The slot is created after events were written (no `converge migrate up`
// made it first): a slot sees only what commits after it, so the relay
// publishes the outbox's rows from the table before it streams.
func TestCreatingTheSlotOverAFilledOutboxPublishesIt(t *testing.T) {
	f := newFixture(t)
	f.write(t, 0, 5, 1) // no slot yet
	var logs testenv.LockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	r, stop := f.runWith(t, relay.Config{}, nil, log)
	testenv.Eventually(t, "the relay to be active", 10*time.Second, r.Active)
	f.write(t, 5, 8, 1)
	testenv.Eventually(t, "every event in the stream", 10*time.Second, func() bool { return streamMsgs(t, f.js) == 8 })
	stop()
	if !strings.Contains(logs.String(), "caught up from the outbox") || !strings.Contains(logs.String(), "published=5") {
		t.Fatalf("no catch-up of the 5 events written before the slot:\n%s", logs.String())
	}
	events, surplus := compareWithOutbox(t, f.pool, storedEvents(t, f.js))
	if events != 8 || surplus != 0 {
		t.Fatalf("%d events, %d surplus copies; want 8, 0", events, surplus)
	}
}

// With a byte window smaller than one event, the relay publishes one event
// at a time and still relays everything.
func TestByteWindowSmallerThanAnEventStillRelays(t *testing.T) {
	f := newFixture(t)
	f.startRelay(t, relay.Config{WindowBytes: 1})
	f.waitSlot(t)
	f.write(t, 0, 300, 1)
	testenv.Eventually(t, "300 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 300 })
}

// Publishes whose acknowledgements never come (here: the stream is deleted
// and a plain subscriber swallows the messages, so not even a no-responders
// reply arrives) end the session after AckTimeout; nothing is confirmed, and
// the next session recreates the stream and republishes every event.
func TestLostAcknowledgementsRepublish(t *testing.T) {
	f := newFixture(t)
	metrics := relay.NewMetrics(nil)
	// A short status interval: acknowledgements are taken in, and their
	// absence noticed, at least that often.
	runRelay(t, f.nats.Connect(t), f.dbURL, relay.Config{AckTimeout: time.Second, StatusInterval: 200 * time.Millisecond,
		StandbyRetry: 100 * time.Millisecond}, metrics)
	f.waitSlot(t)
	testenv.Eventually(t, "stream", 10*time.Second, func() bool { _, err := f.js.Stream(context.Background(), contract.DocsStream); return err == nil })
	var confirmedBefore string
	_ = f.pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE database = current_database()`).Scan(&confirmedBefore)

	f.swallow(t, contract.DocsSubjectPrefix+">")
	if err := f.js.DeleteStream(context.Background(), contract.DocsStream); err != nil {
		t.Fatal(err)
	}
	f.write(t, 0, 100, 1)
	errs := metrics.SessionErrors.WithLabelValues("publish")
	testenv.Eventually(t, "the session to end on the missing acknowledgements", 15*time.Second, func() bool { return testutil.ToFloat64(errs) >= 1 })
	testenv.Eventually(t, "every event republished into the recreated stream", 20*time.Second, func() bool { return streamMsgs(t, f.js) >= 100 })
	// The lost publishes were never counted: once the relay has counted an
	// acknowledgement for each of the 100 events, none is left for a later
	// session to publish again.
	testenv.Eventually(t, "the relay to count 100 acknowledgements", 20*time.Second, func() bool {
		return testutil.ToFloat64(metrics.Published) >= 100
	})
	if n := streamMsgs(t, f.js); n != 100 {
		t.Fatalf("stream holds %d messages, want 100", n)
	}
	t.Logf("confirmed_flush_lsn before the loss %s; %v session(s) ended on lost acknowledgements", confirmedBefore, testutil.ToFloat64(errs))
}

// TestRelayKeepsCommitOrderWhenAPublishIsLost: a publish lost in flight
// while the connection stays up (what a stream leader's loss does on a
// cluster; here the server maps one document's subject to a subscriber
// that never answers) must not let the events published after it be
// stored before it. The stream refuses them (each expects the sequence
// of the one before it), the session ends at the first refusal instead
// of waiting for the lost publish's acknowledgement timeout, and the next
// session publishes the lost event and those after it in commit order.
func TestRelayKeepsCommitOrderWhenAPublishIsLost(t *testing.T) {
	f := newFixture(t)
	metrics := relay.NewMetrics(nil)
	// An acknowledgement timeout longer than the waits below: only the
	// refusal can end the session in time.
	_, logs := runRelayLogged(t, f.nats.Connect(t), f.dbURL, relay.Config{AckTimeout: 2 * time.Minute, StatusInterval: 200 * time.Millisecond,
		StandbyRetry: 100 * time.Millisecond}, metrics)
	f.waitSlot(t)
	f.write(t, 0, 10, 1)
	testenv.Eventually(t, "10 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 10 })

	docs := corpus.Sequential(20, corpus.Shape{Version: 1, Title: corpus.Fixed("t")})
	// Known to the server before the relay publishes (else the lost
	// publish is answered "no responders").
	f.swallow(t, "lost.>")
	acc := f.nats.Server.Server.GlobalAccount()
	lostSubject := contract.Subject(docs[10].Key)
	if err := acc.AddMapping(lostSubject, "lost.one"); err != nil {
		t.Fatal(err)
	}
	f.write(t, 10, 20, 1) // one transaction: the first of its events is lost
	testenv.Eventually(t, "the stream to refuse the events after the lost one", 20*time.Second, func() bool {
		return testutil.ToFloat64(metrics.Refused) >= 1
	})
	acc.RemoveMapping(lostSubject)
	testenv.Eventually(t, "the 10 events of the transaction", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 20 })
	waitConfirmedPastNow(t, f.pool, "converge_relay", 10*time.Second)
	if n := streamMsgs(t, f.js); n != 20 {
		t.Fatalf("stream holds %d messages, want 20", n)
	}
	if !strings.Contains(logs.String(), "an earlier publish was lost") {
		t.Errorf("no session ended on the refusal; the relay logged:\n%s", logs.String())
	}
	s, err := f.js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	var keys, want []string
	for seq := uint64(1); seq <= 20; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := contract.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		keys = append(keys, ev.Key)
	}
	for _, d := range docs {
		want = append(want, d.Key)
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("the events are stored as %v; want %v, in commit order", keys, want)
	}
	t.Logf("%v publishes refused after the lost one", testutil.ToFloat64(metrics.Refused))
}

// TestRelayCreatesAStreamGoneForLong: a stream that answers nothing (no
// responders: a cluster electing a leader, or a stream deleted) ends the
// session, and the next one starts soon, not after -standby-retry (a
// minute here). After 10s without a stream the relay creates it again,
// and every event is published.
func TestRelayCreatesAStreamGoneForLong(t *testing.T) {
	// Its own NATS server and database, and a slot of its own name: the
	// shared cluster's slot names are one namespace, and the other
	// parallel tests on it take other names.
	t.Parallel()
	const slot = "stream_gone"
	f := newFixture(t)
	metrics := relay.NewMetrics(nil)
	runRelay(t, f.nats.Connect(t), f.dbURL, relay.Config{Slot: slot, StatusInterval: 200 * time.Millisecond, StandbyRetry: time.Minute}, metrics)
	waitSlotActive(t, f.pool, slot)
	f.write(t, 0, 10, 1)
	testenv.Eventually(t, "10 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 10 })
	waitConfirmedPastNow(t, f.pool, slot, 10*time.Second)
	if err := f.js.DeleteStream(context.Background(), contract.DocsStream); err != nil {
		t.Fatal(err)
	}
	f.write(t, 10, 20, 1)
	errs := metrics.SessionErrors.WithLabelValues("publish")
	testenv.Eventually(t, "sessions to end on the missing stream, more than one", 10*time.Second, func() bool { return testutil.ToFloat64(errs) >= 2 })
	testenv.Eventually(t, "the stream created again and the 10 events in it", 30*time.Second, func() bool { return streamMsgs(t, f.js) >= 10 })
	waitConfirmedPastNow(t, f.pool, slot, 10*time.Second)
	if n := streamMsgs(t, f.js); n != 10 {
		t.Fatalf("the new stream holds %d messages, want the 10 written after the old one was deleted", n)
	}
}

// With tracing off the relay passes a row's trace context on unchanged,
// as the message's traceparent header, so that the projectors and the
// notifier continue the writer's trace; a row without one gets none.
func TestRelayPassesTheTraceContextWithTracingOff(t *testing.T) {
	f := newFixture(t)
	f.startRelay(t, relay.Config{})
	f.waitSlot(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	docs := corpus.Sequential(2, corpus.Shape{Version: 1, Title: corpus.Fixed("t"), Body: func(i int) string { return fmt.Sprintf("body %d", i) }})
	outs, err := f.store.Apply(context.Background(), []docstore.Write{{Doc: docs[0], TraceParent: tp}, {Doc: docs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if o.Err != nil || o.Result != docstore.Applied {
			t.Fatalf("write %s: %v %v", o.Key, o.Result, o.Err)
		}
	}
	testenv.Eventually(t, "2 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 2 })
	s, err := f.js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := contract.DecodeEvent(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		got[ev.Key] = m.Header.Values("traceparent")
	}
	if v := got[docs[0].Key]; len(v) != 1 || v[0] != tp {
		t.Errorf("the traced row's message has traceparent %q; want %q", v, tp)
	}
	if v, ok := got[docs[1].Key]; !ok || len(v) != 0 {
		t.Errorf("the untraced row's message has traceparent %q (found %v); want none", v, ok)
	}
}
