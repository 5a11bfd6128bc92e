//go:build linux

// Package e2e_test runs the real pipeline: documents written to Postgres by
// the writer's store, relayed through logical replication into an embedded
// NATS JetStream server, projected into the embedded index; and checks that
// the index ends equal to Postgres (point ids, versions and content hashes
// per document, not counts) under redelivery, reordering, replay, a poison
// message and SIGKILLs of the projector.
package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	vpostgres "github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

var pg *testenv.Postgres

// childEnv makes the test binary run a projector ("index" or "graph")
// instead of the tests, so that a test can SIGKILL it.
const childEnv = "CONVERGE_E2E_PROJECTOR_CHILD"

// childReady is the line a child prints on stdout once it handles SIGTERM.
const childReady = "ready"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "index":
		os.Exit(runProjectorChild())
	case "graph":
		os.Exit(runGraphChild())
	}
	os.Exit(testenv.RunMain(m, &pg))
}

const dim = 64

// runProjectorChild projects CONVERGE_NATS_URL's stream into the embedded
// index in CONVERGE_DATA_DIR until SIGTERM (or SIGKILL).
func runProjectorChild() int {
	return runChild("index", func(ctx context.Context) (projector.Store, func() error, error) {
		store, err := embedded.Open(os.Getenv("CONVERGE_DATA_DIR"), embedded.Options{})
		if err != nil {
			return nil, nil, err
		}
		x, err := newIndex(ctx, store)
		if err != nil {
			_ = store.Close()
			return nil, nil, err
		}
		return x, store.Close, nil
	})
}

// runChild runs projector name over the store open returns, on
// CONVERGE_NATS_URL's stream, until SIGTERM (or SIGKILL): the projector
// service over that store, as a projector's binary runs it. Its exit
// status: 0 after SIGTERM (also while starting), 1 when the service
// failed, 2 when its store could not be opened.
func runChild(name string, open func(context.Context) (projector.Store, func() error, error)) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println(childReady) // SIGTERM is handled from here on
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	store, closeStore, err := open(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return 0 // stopped while starting
		}
		log.Error("open the store", "err", err)
		return 2
	}
	defer func() { _ = closeStore() }()
	sc := projector.ServiceConfig{NATSURL: os.Getenv("CONVERGE_NATS_URL"),
		Runtime: projector.Config{Name: name, BatchSize: 64, AckWait: 2 * time.Second}}
	err = service.Run(ctx, sc, log, func(ctx context.Context, sc projector.ServiceConfig, deps service.Deps) error {
		return projector.RunService(ctx, sc, store, nil, deps)
	})
	if err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

func newIndex(ctx context.Context, b index.Backend) (*index.Index, error) {
	e, err := embed.NewHash(dim)
	if err != nil {
		return nil, err
	}
	return index.New(ctx, b, e, index.Options{})
}

// pipeline is a migrated database, an embedded NATS server and the relay
// between them, with the writer's store on the database.
type pipeline struct {
	*stacktest.Stack
	store *docstore.Store
	mu    sync.Mutex // guards rng
	rng   *rand.Rand
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	st := stacktest.New(t, pg)
	store, err := docstore.New(st.Pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.StartRelay(t, relay.ServiceConfig{NATSURL: st.NATS.URL,
		Relay: relay.Config{PostgresURL: st.PostgresURL, StandbyRetry: 100 * time.Millisecond}})
	return &pipeline{Stack: st, store: store, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
}

// write applies random upserts and withdrawals of keys doc-0..doc-(keys-1),
// each at a version above the stored one, in batches of up to 20.
func (p *pipeline) write(t *testing.T, n, keys int) {
	t.Helper()
	if err := p.tryWrite(n, keys); err != nil {
		t.Fatal(err)
	}
}

func (p *pipeline) tryWrite(n, keys int) error {
	var writes []docstore.Write
	var failed error
	flush := func() {
		outs, err := p.store.Apply(context.Background(), writes)
		if err != nil && failed == nil {
			failed = err
		}
		for _, o := range outs {
			if o.Err != nil && failed == nil {
				failed = fmt.Errorf("write %s: %w", o.Key, o.Err)
			}
		}
		writes = writes[:0]
	}
	seen := map[string]bool{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range n {
		key := fmt.Sprintf("doc-%d", p.rng.IntN(keys))
		if seen[key] {
			flush()
			clear(seen)
		}
		seen[key] = true
		version := time.Now().UnixNano() + int64(i)
		var links []string
		for range p.rng.IntN(4) {
			// Some links point past the written keys: stubs in the graph.
			links = append(links, fmt.Sprintf("doc-%d", p.rng.IntN(keys+keys/4)))
		}
		w := docstore.Write{Doc: contract.Document{Key: key, Version: version, Title: "Title " + key,
			Body: body(p.rng.IntN(6)+1, key, version), Links: links, Tags: []string{fmt.Sprint("t", p.rng.IntN(3)), fmt.Sprint("u", p.rng.IntN(2))}}}
		if p.rng.IntN(10) == 0 {
			w = docstore.Write{Withdraw: true, Doc: contract.Document{Key: key, Version: version}}
		}
		writes = append(writes, w)
		if len(writes) == 20 {
			flush()
			clear(seen)
		}
	}
	if len(writes) > 0 {
		flush()
	}
	return failed
}

func body(paragraphs int, key string, version int64) string {
	var b bytes.Buffer
	for i := range paragraphs {
		// ~700 bytes a paragraph: several chunks per document.
		fmt.Fprintf(&b, "Paragraph %d of %s at %d. %s\n\n", i, key, version, bytes.Repeat([]byte("lorem ipsum dolor sit amet "), 25))
	}
	return b.String()
}

// diff compares the index with Postgres and returns the first difference,
// or "" when they agree on every document: its version marker (version,
// tombstone, content hash) and its points (ids in ordinal order, version,
// chunk hashes, content hash), and no document in the index that Postgres
// does not have.
func diff(ctx context.Context, pool *pgxpool.Pool, b index.Backend) (string, error) {
	type doc struct {
		version int64
		deleted bool
		hash    string
		chunks  []index.Point
	}
	docs := map[string]*doc{}
	rows, err := pool.Query(ctx, `SELECT key, version, deleted, content_hash FROM documents`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		d := &doc{}
		var key string
		if err := rows.Scan(&key, &d.version, &d.deleted, &d.hash); err != nil {
			return "", err
		}
		docs[key] = d
	}
	if rows.Err() != nil {
		return "", rows.Err()
	}
	rows, err = pool.Query(ctx, `SELECT id, key, version, ordinal, content_hash FROM chunks ORDER BY key, ordinal`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var c index.Point
		if err := rows.Scan(&c.ID, &c.Key, &c.Version, &c.Ordinal, &c.ChunkHash); err != nil {
			return "", err
		}
		docs[c.Key].chunks = append(docs[c.Key].chunks, c)
	}
	if rows.Err() != nil {
		return "", rows.Err()
	}
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	markers, err := b.Markers(ctx, keys)
	if err != nil {
		return "", err
	}
	for key, d := range docs {
		m, ok := markers[key]
		if !ok || m.Version != d.version || m.Deleted != d.deleted || m.ContentHash != d.hash {
			return fmt.Sprintf("%s: index marker %+v (present %v), Postgres version %d deleted %v hash %s", key, m, ok, d.version, d.deleted, d.hash), nil
		}
		pts, err := b.Points(ctx, key, false)
		if err != nil {
			return "", err
		}
		if len(pts) != len(d.chunks) {
			return fmt.Sprintf("%s: %d points in the index, %d chunks in Postgres", key, len(pts), len(d.chunks)), nil
		}
		for i, p := range pts {
			c := d.chunks[i]
			if p.ID != c.ID || p.Version != c.Version || p.Ordinal != c.Ordinal || p.ChunkHash != c.ChunkHash || p.ContentHash != d.hash {
				return fmt.Sprintf("%s: point %d is %v v%d #%d %s (doc %s), Postgres has %v v%d #%d %s (doc %s)", key, i,
					p.ID, p.Version, p.Ordinal, p.ChunkHash, p.ContentHash, c.ID, c.Version, c.Ordinal, c.ChunkHash, d.hash), nil
			}
		}
	}
	extra := ""
	err = b.ScanMarkers(ctx, func(m index.Marker) error {
		if _, ok := docs[m.Key]; !ok && extra == "" {
			extra = fmt.Sprintf("%s: in the index (version %d), not in Postgres", m.Key, m.Version)
		}
		return nil
	})
	return extra, err
}

// converge waits until the index agrees with Postgres.
func converge(t *testing.T, pool *pgxpool.Pool, b index.Backend, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, err := diff(context.Background(), pool, b)
		if err != nil {
			t.Fatal(err)
		}
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index did not converge within %v: %s", timeout, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runProjector runs the projector service name over x in the test process
// until the returned stop is called.
func runProjector(t *testing.T, p *pipeline, x projector.Store, name string) (stop func()) {
	t.Helper()
	svc := stacktest.StartProjector(t, projector.ServiceConfig{NATSURL: p.NATS.URL,
		Runtime: projector.Config{Name: name, BatchSize: 64, RetryMin: 10 * time.Millisecond}}, x, nil)
	return func() {
		if err := svc.Stop(); err != nil {
			t.Errorf("projector %s: %v", name, err)
		}
	}
}

func openStore(t *testing.T, dir string) *embedded.Store {
	t.Helper()
	s, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The index converges to Postgres; then every message is delivered twice
// more (two replays of the whole stream from its start, through the same
// durable state), an old version is published again after its successor,
// and a poison message arrives: the index still equals Postgres, and the
// poison is in the dead-letter stream with its reason.
func TestIndexConvergesUnderRedeliveryReorderAndPoison(t *testing.T) {
	p := newPipeline(t)
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	x, err := newIndex(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	stop := runProjector(t, p, x, "index")
	p.write(t, 600, 80)
	converge(t, p.Pool, store, 60*time.Second)
	stop()

	// Two more deliveries of every message: replay from the start with new
	// consumers into the same index.
	for pass := 2; pass <= 3; pass++ {
		name := fmt.Sprintf("index-pass-%d", pass)
		stop := runProjector(t, p, x, name)
		testenv.Eventually(t, "the replay to catch up", 60*time.Second, func() bool { return caughtUp(t, p.JetStream, name) })
		stop()
		if d, err := diff(context.Background(), p.Pool, store); err != nil || d != "" {
			t.Fatalf("after delivery %d of every message: %s %v", pass, d, err)
		}
	}

	// An older version arriving after its successor, and a poison message.
	var key string
	var version int64
	if err := p.Pool.QueryRow(context.Background(), `SELECT key, version FROM documents WHERE NOT deleted ORDER BY key LIMIT 1`).Scan(&key, &version); err != nil {
		t.Fatal(err)
	}
	d, _ := contract.Document{Key: key, Version: version - 1, Title: "stale", Body: "a stale body"}.Normalize()
	stale := contract.NewUpsertedEvent(d, []string{d.Body})
	data, _ := stale.Encode()
	if _, err := p.JetStream.Publish(context.Background(), contract.Subject(key), data); err != nil {
		t.Fatal(err)
	}
	if _, err := p.JetStream.Publish(context.Background(), contract.Subject("poison"), []byte("{not an event")); err != nil {
		t.Fatal(err)
	}
	stop = runProjector(t, p, x, "index")
	p.write(t, 100, 80)
	converge(t, p.Pool, store, 60*time.Second)
	testenv.Eventually(t, "the poison message's dead letter", 10*time.Second, func() bool {
		s, err := p.JetStream.Stream(context.Background(), deadletter.Stream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(context.Background(), contract.DLQSubject("index"))
		return err == nil && m.Header.Get(deadletter.HeaderCode) == "undecodable" && m.Header.Get(deadletter.HeaderReason) != ""
	})
	stop()
	if d, err := diff(context.Background(), p.Pool, store); err != nil || d != "" {
		t.Fatalf("at the end: %s %v", d, err)
	}
	verifyIndex(t, p, store)
}

// verifyIndex checks converge verify's machinery on a converged index:
// through the projector's HTTP endpoints it agrees; after points of one
// document are deleted behind the projector's back it names exactly that
// document.
func verifyIndex(t *testing.T, p *pipeline, store index.Backend) {
	t.Helper()
	ctx := context.Background()
	srv := httptest.NewServer(verify.Handler(verify.Index, func(ctx context.Context) ([]verify.Doc, error) { return verify.ReadIndex(ctx, store) }))
	defer srv.Close()
	side := &verify.Remote{Label: "index", Addr: strings.TrimPrefix(srv.URL, "http://")}
	truth := &vpostgres.Postgres{Pool: p.Pool}
	rep, err := verify.Compare(ctx, truth, side, verify.Index, verify.DefaultBuckets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Agrees || rep.Documents == 0 || rep.Documents != rep.StoreDocuments {
		t.Fatalf("verify of a converged index: %+v", rep)
	}
	var key string
	if err := p.Pool.QueryRow(ctx, `SELECT key FROM documents WHERE NOT deleted ORDER BY key DESC LIMIT 1`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if err := store.DeleteStale(ctx, []index.Keep{{Key: key}}); err != nil {
		t.Fatal(err)
	}
	rep, err = verify.Compare(ctx, truth, side, verify.Index, verify.DefaultBuckets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Agrees || len(rep.Differences) != 1 || rep.Differences[0].Key != key || rep.Differences[0].Problem != verify.StaleChunks {
		t.Fatalf("verify after deleting %s's points: %+v", key, rep.Differences)
	}
	t.Logf("verify: %d documents agree; after deleting the points of %s: %s (%s)", rep.Documents, key, rep.Differences[0].Problem, rep.Differences[0].Detail)
}

func caughtUp(t *testing.T, js jetstream.JetStream, consumer string) bool {
	t.Helper()
	c, err := js.Consumer(context.Background(), "CONVERGE_DOCS", consumer)
	if err != nil {
		return false
	}
	info, err := c.Info(context.Background())
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// A projector in a child process is SIGKILLed at random points while the
// writer keeps writing, and restarted each time; at the end the index, read
// from its files by a fresh process, equals Postgres.
func TestIndexProjectorSurvivesSIGKILL(t *testing.T) {
	p := newPipeline(t)
	dir := t.TempDir()
	kills := crashProjector(t, p, "index", "CONVERGE_DATA_DIR="+dir)
	store := openStore(t, dir)
	defer store.Close()
	if d, err := diff(context.Background(), p.Pool, store); err != nil || d != "" {
		t.Fatalf("after %d SIGKILLs: %s %v", kills, d, err)
	}
	var docs int
	_ = p.Pool.QueryRow(context.Background(), `SELECT count(*) FROM documents`).Scan(&docs)
	t.Logf("%d SIGKILLs of the projector; the index equals Postgres on all %d documents", kills, docs)
}

// crashProjector runs a projector of kind ("index" or "graph") in a child
// process on the store storeEnv names (CONVERGE_DATA_DIR, or
// CONVERGE_NEO4J_URL and its credentials), SIGKILLs it at random points while the writer writes
// 1,000 documents and a few times after, restarts it each time, and
// finally lets one catch up and stop with SIGTERM. It returns the number
// of kills.
func crashProjector(t *testing.T, p *pipeline, kind string, storeEnv ...string) int {
	t.Helper()
	var logs bytes.Buffer
	var logsMu sync.Mutex
	// start starts a child; ready is closed once it has reported that it
	// handles SIGTERM (its first line).
	start := func() (c *proc.Child, ready <-chan struct{}) {
		reported := make(chan struct{})
		var head []byte
		out := writerFunc(func(b []byte) (int, error) {
			logsMu.Lock()
			defer logsMu.Unlock()
			if n := len(childReady) + 1; len(head) < n {
				head = append(head, b[:min(len(b), n-len(head))]...)
				if string(head) == childReady+"\n" {
					close(reported)
				}
			}
			return logs.Write(b)
		})
		env := append([]string{childEnv + "=" + kind, "CONVERGE_NATS_URL=" + p.NATS.URL}, storeEnv...)
		c, err := proc.Start(os.Args[0], nil, proc.Options{Env: env, Out: out})
		if err != nil {
			t.Fatal(err)
		}
		return c, reported
	}
	t.Cleanup(func() {
		if t.Failed() {
			logsMu.Lock()
			t.Logf("projector output (tail):\n%s", lastBytes(logs.String(), 4000))
			logsMu.Unlock()
		}
	})

	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for range 10 {
			if err := p.tryWrite(100, 60); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	kills := 0
	kill := func(lo, spread int) {
		c, _ := start()
		time.Sleep(time.Duration(lo+rand.IntN(spread)) * time.Millisecond)
		c.Kill()
		kills++
	}
	for done := false; !done; {
		kill(150, 400)
		select {
		case <-writing:
			done = true
		default:
		}
	}
	for range 3 { // and a few more once the writer is done
		kill(100, 300)
	}
	c, ready := start()
	defer c.Kill()
	// Only a child that handles SIGTERM can be asked to stop gracefully.
	select {
	case <-ready:
	case <-c.Done():
		t.Fatalf("the projector child exited before it reported ready: %v", c.Err())
	case <-time.After(30 * time.Second):
		t.Fatal("the projector child did not report ready within 30s")
	}
	testenv.Eventually(t, "the projector to catch up", 90*time.Second, func() bool { return caughtUp(t, p.JetStream, kind) })
	if err := c.Stop(time.Minute); err != nil {
		t.Fatalf("projector after SIGTERM: %v", err)
	}
	return kills
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
