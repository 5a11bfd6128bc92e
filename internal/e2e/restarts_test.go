//go:build linux

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	neo4jdriver "github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/storage/wal"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// Settings of TestRestartsNeverWedge, from the environment.
const (
	envRestartSeed   = "CONVERGE_E2E_RESTART_SEED"   // repeats a run
	envRestartRounds = "CONVERGE_E2E_RESTART_ROUNDS" // kills per service (default 8): more for a longer run
)

// restartTarget is one service of TestRestartsNeverWedge: its binary, how
// to give it a fresh or a half-made store, and how to tell that it
// converged.
type restartTarget struct {
	proc *process
	// fresh deletes what the service keeps (its store, its consumer, its
	// buckets), as before its first start; nil: every round goes on
	// from what the kills left.
	fresh func(t *testing.T)
	// halfMade, when set, leaves the store in a state that a process
	// killed while making or writing it leaves, and says which; "" when
	// there is nothing to make it from yet.
	halfMade func(t *testing.T, rng *rand.Rand) string
	// converge waits, the service running again after the rounds, until
	// its store agrees with what was written, or fails t.
	converge func(t *testing.T)
}

// TestRestartsNeverWedge starts each service binary (the graph projector
// on Neo4j and on the embedded graph, the index projector on the embedded
// index, the notifier, the writer) again and again, on a fresh store, on
// a half-made one (as a kill while it was made or written leaves it), or
// on what the previous round left, and SIGKILLs it after a random delay:
// half of the kills within its first 400 ms, where it opens its store and
// makes its schema, streams, buckets and consumers, the others within
// 1.5 s, among its first writes. No start may end by itself. Then it
// starts the service once more: it must become ready and converge (the
// store agrees with Postgres, every event is notified, every acknowledged
// write is stored). The services run side by side, each on its own
// store; the seed is logged (CONVERGE_E2E_RESTART_SEED repeats a run,
// CONVERGE_E2E_RESTART_ROUNDS sets the kills per service).
//
// The graph projector on Neo4j could not start again once a kill during
// its CREATE CONSTRAINT had left an index of the constraint's name without
// the constraint (see internal/graph/neo4j): every start that met one
// ended at once.
func TestRestartsNeverWedge(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs every service binary")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envRestartSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envRestartSeed, s, err)
		}
	}
	rounds := 8
	if s := os.Getenv(envRestartRounds); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: want a positive number", envRestartRounds, s)
		}
	}
	t.Logf("seed %d, %d rounds per service (%s=%d repeats the run)", seed, rounds, envRestartSeed, seed)
	bin := testenv.BuildBinaries(t)

	// Postgres, NATS and the relay, publishing every event to the
	// documents' stream and to the effects' stream; 240 writes to start
	// with, and more while the first rounds run.
	st := stacktest.New(t, pg)
	store, err := docstore.New(st.Pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.StartRelay(t, relay.ServiceConfig{NATSURL: st.NATS.URL, Relay: relay.Config{PostgresURL: st.PostgresURL,
		StandbyRetry: 100 * time.Millisecond, Effects: relay.EffectsConfig{Enabled: true}}})
	p := &pipeline{Stack: st, store: store, rng: rand.New(rand.NewPCG(seed, 1))}
	p.write(t, 240, 60)
	written := make(chan struct{})
	t.Cleanup(func() { <-written })
	go func() {
		defer close(written)
		for range 8 {
			if err := p.tryWrite(20, 60); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()

	targets := []struct {
		name string
		make func(t *testing.T) *restartTarget
	}{
		{"graph-neo4j", func(t *testing.T) *restartTarget {
			n := testenv.LeaseNeo4j(t)
			return graphTarget(t, p, bin, written, "graph-neo4j", &n)
		}},
		{"graph-embedded", func(t *testing.T) *restartTarget { return graphTarget(t, p, bin, written, "graph-embedded", nil) }},
		{"index", func(t *testing.T) *restartTarget { return indexTarget(t, p, bin, written) }},
		{"notifier", func(t *testing.T) *restartTarget { return notifierTarget(t, p, bin, written) }},
		{"writer", func(t *testing.T) *restartTarget { return writerTarget(t, p, bin, false) }},
		// A writer killed while it migrates leaves golang-migrate's version
		// dirty; the next start settles it (internal/schema).
		{"writer-migrate", func(t *testing.T) *restartTarget { return writerTarget(t, p, bin, true) }},
	}
	for i, target := range targets {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			restartRounds(t, target.make(t), rounds, rand.New(rand.NewPCG(seed, uint64(i)+2)))
		})
	}
}

// restartRounds starts and SIGKILLs rt's service rounds times: the first
// round on a fresh store, the second on a half-made one, the others on
// either or on what the kill before left, at random. A start that ends
// by itself fails the test: the store was left in a state the service
// cannot start from. Then it starts the service once more and requires it
// to become ready and converge.
func restartRounds(t *testing.T, rt *restartTarget, rounds int, rng *rand.Rand) {
	s := rt.proc
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("--- %s output (tail) ---\n%s", s.name, lastBytes(s.logs.String(), 6000))
		}
	})
	var summary []string
	for round := 1; round <= rounds; round++ {
		var made []string
		switch choice := rng.IntN(3); {
		case rt.fresh != nil && (round == 1 || round > 2 && choice == 0):
			rt.fresh(t)
			made = append(made, "fresh")
		case rt.halfMade != nil && (round == 2 || choice == 1):
			if what := rt.halfMade(t, rng); what != "" {
				made = append(made, what)
			}
		}
		limit := 1500 * time.Millisecond
		if rng.IntN(2) == 0 {
			limit = 400 * time.Millisecond
		}
		delay := time.Duration(rng.Int64N(int64(limit)))
		mark := len(s.logs.String())
		s.start()
		c := s.running()
		select {
		case <-time.After(delay):
			s.kill()
			summary = append(summary, fmt.Sprintf("%d:%s", round, strings.Join(append(made, delay.Round(time.Millisecond).String()), ",")))
		case <-c.Done():
			s.take()
			summary = append(summary, fmt.Sprintf("%d:%s", round, strings.Join(append(made, "EXITED"), ",")))
			t.Errorf("round %d (%s): %s exited by itself before its kill at %v: %v\n%s", round, strings.Join(made, ", "), s.name,
				delay.Round(time.Millisecond), c.Err(), lastBytes(s.logs.String()[mark:], 1500))
		}
	}
	t.Logf("%s rounds (store, kill delay): %s", s.name, strings.Join(summary, " "))

	start := time.Now()
	s.start()
	c := s.running()
	testenv.Eventually(t, s.name+" to be ready after its rounds", 60*time.Second, func() bool {
		select {
		case <-c.Done():
			t.Fatalf("%s exited after its rounds instead of becoming ready: %v\n%s", s.name, c.Err(), lastBytes(s.logs.String(), 3000))
		default:
		}
		return s.ready()
	})
	ready := time.Since(start)
	rt.converge(t)
	t.Logf("%s: ready %v after its last start, converged %v after that", s.name, ready.Round(time.Millisecond),
		(time.Since(start) - ready).Round(time.Millisecond))
}

// running is the child of s, or nil.
func (s *process) running() *proc.Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.child
}

// projectorArgs are the flags every projector binary of the rounds runs
// with: a consumer of its own, a short ack wait (what a SIGKILLed process
// had in flight comes again after it) and the same metrics address each
// time, which names the lease's holder, so that a restart takes its lease
// over at once.
func projectorArgs(t *testing.T, p *pipeline, name string) (args []string, addr string) {
	addr = freePort(t)
	return []string{"-nats-url", p.NATS.URL, "-name", name, "-metrics-addr", addr, "-ack-wait", "2s"}, addr
}

// deleteConsumer deletes a durable consumer, so that a fresh store is
// filled from the stream's start.
func deleteConsumer(t *testing.T, js jetstream.JetStream, stream, name string) {
	t.Helper()
	err := js.DeleteConsumer(context.Background(), stream, name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("delete consumer %s of %s: %v", name, stream, err)
	}
}

// emptyDir removes everything in dir.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// caughtUpOn waits until the writes are done (written closed), the relay
// has published them, and the consumer name has applied everything on its
// stream.
func caughtUpOn(t *testing.T, p *pipeline, written <-chan struct{}, stream, name string) {
	t.Helper()
	<-written
	if stream == contract.DocsStream {
		p.waitRelayed(t)
	}
	testenv.Eventually(t, name+" to catch up", 90*time.Second, func() bool {
		c, err := p.JetStream.Consumer(context.Background(), stream, name)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// graphTarget is the graph projector on Neo4j n, or on the embedded graph
// when n is nil. A fresh Neo4j store has neither the projection nor the
// constraints and their indexes.
func graphTarget(t *testing.T, p *pipeline, bin *testenv.Binaries, written <-chan struct{}, name string, n *testenv.Neo4j) *restartTarget {
	args, addr := projectorArgs(t, p, name)
	data := t.TempDir()
	args = append(args, "-data-dir", data)
	var env []string
	open := func(t *testing.T) graph.Backend {
		s, err := graphembedded.Open(filepath.Join(data, "graph"), graphembedded.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fresh := func(t *testing.T) {
		deleteConsumer(t, p.JetStream, contract.DocsStream, name)
		emptyDir(t, data)
	}
	halfMade := (&walDamage{dir: filepath.Join(data, "graph")}).make
	if n != nil {
		args = append(args, "-neo4j-url", n.URL, "-neo4j-user", n.User)
		env = append(env, "CONVERGE_NEO4J_PASSWORD="+n.Password)
		open = func(t *testing.T) graph.Backend {
			b, err := neo4j.New(context.Background(), neo4j.Config{URL: n.URL, User: n.User, Password: n.Password})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		fresh = func(t *testing.T) {
			deleteConsumer(t, p.JetStream, contract.DocsStream, name)
			dropNeo4jSchema(t, n)
		}
		halfMade = func(t *testing.T, rng *rand.Rand) string {
			fresh(t)
			return orphanIndex(t, n, rng)
		}
	}
	rt := &restartTarget{
		proc:     &process{t: t, name: "projector-graph (" + name + ")", bin: bin.Path("projector-graph"), args: args, env: env, addr: addr},
		fresh:    fresh,
		halfMade: halfMade,
	}
	rt.converge = func(t *testing.T) {
		caughtUpOn(t, p, written, contract.DocsStream, name)
		// Read by a fresh connection (the embedded graph from its files,
		// once the process has let go of them).
		rt.proc.stop()
		b := open(t)
		defer b.Close()
		if d, err := graphDiff(context.Background(), p.Pool, b); err != nil || d != "" {
			t.Fatalf("the graph differs from Postgres: %s %v", d, err)
		}
	}
	return rt
}

// indexTarget is the index projector on the embedded index.
func indexTarget(t *testing.T, p *pipeline, bin *testenv.Binaries, written <-chan struct{}) *restartTarget {
	const name = "index"
	args, addr := projectorArgs(t, p, name)
	data := t.TempDir()
	args = append(args, "-data-dir", data)
	rt := &restartTarget{
		proc: &process{t: t, name: "projector-index", bin: bin.Path("projector-index"), args: args, addr: addr},
		fresh: func(t *testing.T) {
			deleteConsumer(t, p.JetStream, contract.DocsStream, name)
			emptyDir(t, data)
		},
		halfMade: (&walDamage{dir: filepath.Join(data, "index")}).make,
	}
	rt.converge = func(t *testing.T) {
		caughtUpOn(t, p, written, contract.DocsStream, name)
		rt.proc.stop()
		s := openStore(t, filepath.Join(data, "index"))
		defer s.Close()
		if d, err := diff(context.Background(), p.Pool, s, embeddedPoints(s)); err != nil || d != "" {
			t.Fatalf("the index differs from Postgres: %s %v", d, err)
		}
	}
	return rt
}

// notifierTarget is the notifier, posting to a receiver in the test. A
// fresh notifier has no dedup bucket and no consumer (what it had not
// acknowledged is delivered again to the new one). It converged when
// every event of the outbox has reached the receiver and nothing is left
// to notify.
func notifierTarget(t *testing.T, p *pipeline, bin *testenv.Binaries, written <-chan struct{}) *restartTarget {
	const name = "notifier"
	var (
		mu       sync.Mutex
		received = map[string]bool{} // event ids
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			EventID string `json:"event_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.EventID == "" {
			http.Error(w, "no event id", http.StatusBadRequest)
			return
		}
		mu.Lock()
		received[body.EventID] = true
		mu.Unlock()
	}))
	t.Cleanup(receiver.Close)
	args, addr := projectorArgs(t, p, name)
	// A claim that a killed notifier left is taken over after 3 s.
	args = append(args, "-webhook-urls", receiver.URL, "-http-timeout", "1s", "-claim-timeout", "3s")
	rt := &restartTarget{
		proc: &process{t: t, name: "notifier", bin: bin.Path("notifier"), args: args, addr: addr,
			env: []string{notifier.EnvWebhookSecret + "=restart-test-secret"}},
		fresh: func(t *testing.T) {
			deleteConsumer(t, p.JetStream, contract.EventsStream, name)
			if err := p.JetStream.DeleteKeyValue(context.Background(), notifier.DefaultBucket); err != nil &&
				!errors.Is(err, jetstream.ErrBucketNotFound) {
				t.Fatalf("delete bucket %s: %v", notifier.DefaultBucket, err)
			}
		},
	}
	rt.converge = func(t *testing.T) {
		caughtUpOn(t, p, written, contract.EventsStream, name)
		var missing []string
		testenv.Eventually(t, "every event of the outbox to be notified", 60*time.Second, func() bool {
			rows, err := p.Pool.Query(context.Background(), `SELECT event_id::text FROM outbox`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			missing = missing[:0]
			mu.Lock()
			defer mu.Unlock()
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				if !received[id] {
					missing = append(missing, id)
				}
			}
			return rows.Err() == nil && len(missing) == 0
		})
		rt.proc.stop()
	}
	return rt
}

// writerTarget is the writer, on a database of its own (its documents
// would change what the projectors converge to), taking documents from
// its API and from its ingest stream, both sent all through the rounds. A
// fresh writer has no ingest consumer. With migrate, the database starts
// empty, the writer migrates it at start (-migrate), and takes documents
// from its API alone (the ingest stream is the other writer's). It
// converged when every document whose write its API acknowledged, and
// every one published for ingest, is stored, and a new write passes.
func writerTarget(t *testing.T, p *pipeline, bin *testenv.Binaries, migrate bool) *restartTarget {
	httpAddr, addr := freePort(t), freePort(t)
	// A short ack wait: what a SIGKILLed writer took from the ingest
	// stream is delivered again after it, not after the default 30 s.
	args := []string{"-http-addr", httpAddr, "-metrics-addr", addr, "-ack-wait", "3s"}
	var dbURL string
	if migrate {
		dbURL = pg.NewDatabase(t)
		args = append(args, "-migrate")
	} else {
		dbURL = pg.MigratedDatabase(t)
		args = append(args, "-nats-url", p.NATS.URL)
	}
	api := "http://" + httpAddr
	var (
		mu     sync.Mutex
		stored = map[string]int64{} // key: the version it must hold at least
	)
	note := func(d contract.Document) {
		mu.Lock()
		defer mu.Unlock()
		stored[d.Key] = max(stored[d.Key], d.Version)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Producers hand documents over in their own transactions too: the
	// writer SIGKILLed between taking rows of the inbox and applying them
	// leaves them to its next start.
	producer, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for i := 0; ctx.Err() == nil; i++ {
			d := contract.Document{Key: fmt.Sprintf("w/%03d", i%40), Version: int64(i + 1), Title: fmt.Sprint("write ", i),
				Body: fmt.Sprintf("Written through the API, %d.", i)}
			if i%4 == 3 && !migrate { // handed over in SQL
				d.Key = fmt.Sprintf("s/%03d", i%40)
				data, _ := json.Marshal(d)
				if _, err := producer.Exec(ctx, `INSERT INTO converge_inbox (key, document) VALUES ($1, $2)`, d.Key, string(data)); err == nil {
					note(d)
				}
			} else if i%2 == 1 && !migrate { // through ingest
				d.Key = fmt.Sprintf("i/%03d", i%40)
				data, _ := json.Marshal(d)
				if _, err := p.JetStream.Publish(ctx, contract.IngestSubject(d.Key), data); err == nil {
					note(d)
				}
			} else if postOnce(api, d) {
				note(d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-sending })
	rt := &restartTarget{
		proc: &process{t: t, name: "writer", bin: bin.Path("writer"), args: args, addr: addr,
			env: []string{"CONVERGE_POSTGRES_URL=" + dbURL}},
		fresh: func(t *testing.T) { deleteConsumer(t, p.JetStream, writer.IngestStream, writer.IngestConsumer) },
	}
	if migrate {
		rt.proc.name = "writer -migrate"
		rt.fresh = func(t *testing.T) {
			mu.Lock()
			defer mu.Unlock()
			emptyDatabase(t, dbURL)
			clear(stored)
		}
	}
	rt.converge = func(t *testing.T) {
		cancel()
		<-sending
		last := contract.Document{Key: "w/last", Version: 1, Title: "last", Body: "The last write, after the rounds."}
		testenv.Eventually(t, "a write through the writer's API", 30*time.Second, func() bool { return postOnce(api, last) })
		note(last)
		db, err := pgxpool.New(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		deadline := time.Now().Add(60 * time.Second)
		for {
			behind, err := writerBehind(db, func() map[string]int64 {
				mu.Lock()
				defer mu.Unlock()
				return maps.Clone(stored)
			}())
			if err != nil {
				t.Fatal(err)
			}
			if behind == "" && !migrate {
				var left int
				if err := db.QueryRow(context.Background(), `SELECT count(*) FROM converge_inbox`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left > 0 {
					behind = fmt.Sprintf("%d rows left in converge_inbox", left)
				}
			}
			if behind == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not every acknowledged or published document is stored: %s", behind)
			}
			time.Sleep(100 * time.Millisecond)
		}
		rt.proc.stop()
	}
	return rt
}

// emptyDatabase drops everything the migrations made in the database. The
// backends of a SIGKILLed writer go first: Postgres runs a migration's
// transaction on after its client died, and one that committed after the
// drop would leave a publication without its tables behind (the drop of
// the schema waits for its lock, then takes the tables and not the
// publication), a state no crash of the writer itself can make.
func emptyDatabase(t *testing.T, dbURL string) {
	t.Helper()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const others = `FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`
	if _, err := db.Exec(ctx, `SELECT pg_terminate_backend(pid) `+others); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the killed writer's backends to end", 30*time.Second, func() bool {
		var n int
		return db.QueryRow(ctx, `SELECT count(*) `+others).Scan(&n) == nil && n == 0
	})
	if _, err := db.Exec(ctx,
		`DROP PUBLICATION IF EXISTS converge_outbox; DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
}

// writerBehind names a document of want (key: the version it must hold
// at least) that the database does not hold at that version, or "".
func writerBehind(db *pgxpool.Pool, want map[string]int64) (string, error) {
	have := map[string]int64{}
	rows, err := db.Query(context.Background(), `SELECT key, version FROM documents`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return "", err
		}
		have[k] = v
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if have[k] < want[k] {
			return fmt.Sprintf("%s at version %d, want %d or later (of %d documents)", k, have[k], want[k], len(want)), nil
		}
	}
	return "", nil
}

// postOnce posts d to the writer's batch API and reports whether it was
// acknowledged.
func postOnce(api string, d contract.Document) bool {
	var body bytes.Buffer
	if err := json.NewEncoder(&body).Encode(d); err != nil {
		return false
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Post(api+"/v1/documents:batch", "application/x-ndjson", &body)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var answer bytes.Buffer
	_, _ = answer.ReadFrom(resp.Body)
	return resp.StatusCode == http.StatusOK && !bytes.Contains(answer.Bytes(), []byte(`"error"`))
}

// walDamage leaves an embedded store as a process killed while it wrote
// leaves it (see internal/storage/wal): a record cut short at the end of
// its last log, or a snapshot it had not finished.
type walDamage struct {
	dir string
	// tornAt is the size of a log whose end make cut short: while it
	// stays that size, no process has opened the store since (which
	// truncates it), and a second torn record, which no crash leaves
	// behind the first, is not added.
	tornAt map[string]int64
}

// make damages the store and says how; "" when it has no log yet.
func (w *walDamage) make(t *testing.T, rng *rand.Rand) string {
	t.Helper()
	seqs, err := wal.ListLogs(w.dir)
	if err != nil || len(seqs) == 0 {
		return ""
	}
	path := filepath.Join(w.dir, wal.LogName(seqs[len(seqs)-1]))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if rng.IntN(2) == 0 || w.tornAt[path] == fi.Size() {
		if err := os.WriteFile(filepath.Join(w.dir, wal.TempSnapshotName), []byte("a snapshot cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
		return "unfinished snapshot"
	}
	rec, err := wal.Seal(append(wal.NewRecord(64), bytes.Repeat([]byte{0x5a}, 64)...))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cut := rec[:1+rng.IntN(len(rec)-1)]
	if _, err := f.Write(cut); err != nil {
		t.Fatal(err)
	}
	if w.tornAt == nil {
		w.tornAt = map[string]int64{}
	}
	w.tornAt[path] = fi.Size() + int64(len(cut))
	return "torn record"
}

// neo4jConstraints are the graph's constraints: name, label, property.
var neo4jConstraints = [][3]string{
	{"converge_document_key", "Document", "key"},
	{"converge_chunk_id", "Chunk", "id"},
	{"converge_tag_name", "Tag", "name"},
}

// orphanIndex leaves n's schema as a graph projector killed while it
// created its constraints can: the constraints before one of them made,
// and that one's index there without it (see internal/graph/neo4j).
func orphanIndex(t *testing.T, n *testenv.Neo4j, rng *rand.Rand) string {
	t.Helper()
	k := rng.IntN(len(neo4jConstraints))
	var cypher []string
	for _, c := range neo4jConstraints[:k] {
		cypher = append(cypher, fmt.Sprintf("CREATE CONSTRAINT %s FOR (n:%s) REQUIRE n.%s IS UNIQUE", c[0], c[1], c[2]))
	}
	c := neo4jConstraints[k]
	cypher = append(cypher, fmt.Sprintf("CREATE INDEX %s FOR (n:%s) ON (n.%s)", c[0], c[1], c[2]))
	runNeo4j(t, n, cypher...)
	return "orphan " + c[0]
}

// runNeo4j runs each statement in a transaction of its own.
func runNeo4j(t *testing.T, n *testenv.Neo4j, cypher ...string) {
	t.Helper()
	ctx := context.Background()
	driver, err := neo4jdriver.NewDriverWithContext(n.URL, neo4jdriver.BasicAuth(n.User, n.Password, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = driver.Close(ctx) }()
	for _, c := range cypher {
		if _, err := neo4jdriver.ExecuteQuery(ctx, driver, c, nil, neo4jdriver.EagerResultTransformer); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
}

// dropNeo4jSchema deletes the projection, the constraints and any index
// of their names from n.
func dropNeo4jSchema(t *testing.T, n *testenv.Neo4j) {
	t.Helper()
	cypher := []string{`MATCH (n) DETACH DELETE n`}
	for _, c := range neo4jConstraints {
		cypher = append(cypher, "DROP CONSTRAINT "+c[0]+" IF EXISTS", "DROP INDEX "+c[0]+" IF EXISTS")
	}
	runNeo4j(t, n, cypher...)
}
