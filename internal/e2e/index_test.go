//go:build linux

// Package e2e_test runs the real pipeline: documents written to Postgres by
// the writer's store, relayed through logical replication into an embedded
// NATS JetStream server, projected into the embedded index and into a
// collection of a real Qdrant server; and checks that the index ends equal
// to Postgres (point ids, versions, ordinals and hashes per document, and
// no point beside them, not counts) under redelivery, reordering, replay, a
// poison message and SIGKILLs of the projector.
package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/indexprojector"
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

// envQdrantCollection names the child's Qdrant collection.
const envQdrantCollection = "CONVERGE_QDRANT_COLLECTION"

// runProjectorChild projects CONVERGE_NATS_URL's stream into the Qdrant
// collection CONVERGE_QDRANT_COLLECTION at CONVERGE_QDRANT_URL (with
// CONVERGE_QDRANT_API_KEY) or, when that is unset, the embedded index in
// CONVERGE_DATA_DIR, until SIGTERM (or SIGKILL).
func runProjectorChild() int {
	return runChild("index", func(ctx context.Context) (projector.Store, func() error, error) {
		var store index.Backend
		var err error
		if url := os.Getenv(indexprojector.EnvQdrantURL); url != "" {
			store, err = qdrant.New(ctx, qdrant.Config{Addr: url, APIKey: os.Getenv(indexprojector.EnvQdrantAPIKey),
				Collection: os.Getenv(envQdrantCollection)})
		} else {
			store, err = embedded.Open(os.Getenv("CONVERGE_DATA_DIR"), embedded.Options{})
		}
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

// storedPoints is what an index store holds, read past its adapter:
// every chunk point, the key of each marker point (nil for a store whose
// markers are not points), and each point that is neither, described.
type storedPoints struct {
	chunks  []index.Point
	markers []string
	strays  []string
}

// diff compares the index with Postgres and returns the first difference,
// or "" when they agree on every document: its version marker (version,
// tombstone, content hash) and its points as the adapter reads them (ids
// in ordinal order, version, ordinal, chunk and content hashes, title,
// tags, text); no document in the index that Postgres does not have; and,
// read past the adapter (list), every point the store holds is one of
// Postgres's chunks with its key, version, ordinal and hashes, or the
// marker of one of its documents: no point beside them.
func diff(ctx context.Context, pool *pgxpool.Pool, b index.Backend, list func(context.Context) (storedPoints, error)) (string, error) {
	type doc struct {
		version     int64
		deleted     bool
		hash, title string
		tags        []string
		chunks      []index.Point
	}
	docs := map[string]*doc{}
	rows, err := pool.Query(ctx, `SELECT key, version, deleted, content_hash, title, tags FROM documents`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		d := &doc{}
		var key string
		if err := rows.Scan(&key, &d.version, &d.deleted, &d.hash, &d.title, &d.tags); err != nil {
			return "", err
		}
		slices.Sort(d.tags)
		docs[key] = d
	}
	if rows.Err() != nil {
		return "", rows.Err()
	}
	chunks := map[uuid.UUID]index.Point{}
	rows, err = pool.Query(ctx, `SELECT id, key, version, ordinal, content_hash, text FROM chunks ORDER BY key, ordinal`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var c index.Point
		if err := rows.Scan(&c.ID, &c.Key, &c.Version, &c.Ordinal, &c.ChunkHash, &c.Text); err != nil {
			return "", err
		}
		d := docs[c.Key]
		c.ContentHash, c.Title, c.Tags = d.hash, d.title, d.tags
		d.chunks = append(d.chunks, c)
		chunks[c.ID] = c
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
			if c := d.chunks[i]; !samePoint(p, c) {
				return fmt.Sprintf("%s: point %d is %s, Postgres has %s", key, i, describePoint(p), describePoint(c)), nil
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
	if err != nil || extra != "" {
		return extra, err
	}

	stored, err := list(ctx)
	if err != nil {
		return "", err
	}
	if len(stored.strays) > 0 {
		return fmt.Sprintf("%d points in the store are neither chunks nor markers, e.g. %s", len(stored.strays), stored.strays[0]), nil
	}
	for _, p := range stored.chunks {
		c, ok := chunks[p.ID]
		if !ok {
			return fmt.Sprintf("the store holds point %s, which is no chunk in Postgres", describePoint(p)), nil
		}
		if !samePoint(p, c) {
			return fmt.Sprintf("the store holds point %s, Postgres has %s", describePoint(p), describePoint(c)), nil
		}
	}
	if len(stored.chunks) != len(chunks) {
		return fmt.Sprintf("the store holds %d chunk points, Postgres %d chunks", len(stored.chunks), len(chunks)), nil
	}
	if stored.markers != nil {
		seen := map[string]bool{}
		for _, key := range stored.markers {
			if _, ok := docs[key]; !ok || seen[key] {
				return fmt.Sprintf("the store holds a marker point of %s (Postgres has it: %v; a marker before: %v)", key, ok, seen[key]), nil
			}
			seen[key] = true
		}
		if len(seen) != len(docs) {
			return fmt.Sprintf("the store holds %d marker points, Postgres %d documents", len(seen), len(docs)), nil
		}
	}
	return "", nil
}

// samePoint reports whether p, read from the index, is chunk c of
// Postgres (vectors aside).
func samePoint(p, c index.Point) bool {
	return p.ID == c.ID && p.Key == c.Key && p.Version == c.Version && p.Ordinal == c.Ordinal && p.ChunkHash == c.ChunkHash &&
		p.ContentHash == c.ContentHash && p.Title == c.Title && slices.Equal(sortedTags(p.Tags), c.Tags) && p.Text == c.Text
}

func sortedTags(tags []string) []string {
	tags = slices.Clone(tags)
	slices.Sort(tags)
	return tags
}

func describePoint(p index.Point) string {
	return fmt.Sprintf("%v (%s v%d #%d chunk %s doc %s, title %q, tags %v, %d bytes of text)",
		p.ID, p.Key, p.Version, p.Ordinal, p.ChunkHash, p.ContentHash, p.Title, p.Tags, len(p.Text))
}

// converge waits until the index agrees with Postgres.
func converge(t *testing.T, pool *pgxpool.Pool, b index.Backend, list func(context.Context) (storedPoints, error), timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, err := diff(context.Background(), pool, b, list)
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

// indexStore is an index store the end-to-end tests run on: the embedded
// index in a directory, or a collection of the test Qdrant server.
type indexStore struct {
	// open opens the store (again: the same index each time); it is
	// closed when the test ends.
	open func(t *testing.T) index.Backend
	// env names the store to a child process (runProjectorChild).
	env []string
	// points lists what the store b (opened by open) holds, past the
	// adapter where the store allows it.
	points func(b index.Backend) func(context.Context) (storedPoints, error)
	// rest and collection are Qdrant's HTTP API and the collection; nil
	// and "" for the embedded index.
	rest       *qdrantREST
	collection string
}

// forEachIndexStore runs fn as a subtest on each index store.
func forEachIndexStore(t *testing.T, fn func(t *testing.T, is indexStore)) {
	t.Run("embedded", func(t *testing.T) {
		dir := t.TempDir()
		fn(t, indexStore{env: []string{"CONVERGE_DATA_DIR=" + dir, indexprojector.EnvQdrantURL + "="}, points: embeddedPoints,
			open: func(t *testing.T) index.Backend {
				s := openStore(t, dir)
				t.Cleanup(func() { _ = s.Close() })
				return s
			}})
	})
	t.Run("qdrant", func(t *testing.T) {
		q := testenv.LeaseQdrant(t)
		env := []string{indexprojector.EnvQdrantURL + "=" + q.URL, indexprojector.EnvQdrantAPIKey + "=" + q.APIKey, envQdrantCollection + "=" + q.Collection}
		rest := &qdrantREST{url: q.HTTPURL, key: q.APIKey}
		fn(t, indexStore{env: env, rest: rest, collection: q.Collection,
			points: func(index.Backend) func(context.Context) (storedPoints, error) {
				return rest.points(q.Collection)
			},
			open: func(t *testing.T) index.Backend {
				b, err := qdrant.New(context.Background(), qdrant.Config{Addr: q.URL, APIKey: q.APIKey, Collection: q.Collection})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Close() })
				return b
			}})
	})
}

// embeddedPoints lists the points of an embedded index b: its markers are
// no points, and its chunks are what an exact search for more points than
// it holds returns.
func embeddedPoints(b index.Backend) func(context.Context) (storedPoints, error) {
	return func(ctx context.Context) (storedPoints, error) {
		id, ok, err := b.Embedder(ctx)
		if err != nil || !ok {
			return storedPoints{}, err
		}
		query := make([]float32, id.Dimension)
		query[0] = 1
		hits, err := b.Search(ctx, query, 1<<30)
		var sp storedPoints
		for _, h := range hits {
			sp.chunks = append(sp.chunks, h.Point)
		}
		return sp, err
	}
}

// The index converges to Postgres; then every message is delivered twice
// more (two replays of the whole stream from its start, through the same
// durable state), an old version is published again after its successor,
// and a poison message arrives: the index still equals Postgres, and the
// poison is in the dead-letter stream with its reason. On the embedded
// index and on a Qdrant collection.
func TestIndexConvergesUnderRedeliveryReorderAndPoison(t *testing.T) {
	forEachIndexStore(t, testIndexConvergesUnderRedeliveryReorderAndPoison)
}

func testIndexConvergesUnderRedeliveryReorderAndPoison(t *testing.T, is indexStore) {
	p := newPipeline(t)
	store := is.open(t)
	points := is.points(store)
	x, err := newIndex(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	stop := runProjector(t, p, x, "index")
	p.write(t, 600, 80)
	converge(t, p.Pool, store, points, 60*time.Second)
	stop()

	// Two more deliveries of every message: replay from the start with new
	// consumers into the same index.
	for pass := 2; pass <= 3; pass++ {
		name := fmt.Sprintf("index-pass-%d", pass)
		stop := runProjector(t, p, x, name)
		testenv.Eventually(t, "the replay to catch up", 60*time.Second, func() bool { return caughtUp(t, p.JetStream, name) })
		stop()
		if d, err := diff(context.Background(), p.Pool, store, points); err != nil || d != "" {
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
	converge(t, p.Pool, store, points, 60*time.Second)
	testenv.Eventually(t, "the poison message's dead letter", 10*time.Second, func() bool {
		s, err := p.JetStream.Stream(context.Background(), deadletter.Stream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(context.Background(), contract.DLQSubject("index"))
		return err == nil && m.Header.Get(deadletter.HeaderCode) == "undecodable" && m.Header.Get(deadletter.HeaderReason) != ""
	})
	stop()
	if d, err := diff(context.Background(), p.Pool, store, points); err != nil || d != "" {
		t.Fatalf("at the end: %s %v", d, err)
	}
	verifyIndex(t, p, store)
}

// diff, on which every index test relies, finds each difference a store
// can have from Postgres, and agrees again once it is undone: a point
// with another version, ordinal, chunk or content hash, title, tags or
// text; a point too many or too few; a point of a document Postgres does
// not have, whose key has no marker, which only the listing past the
// adapter shows; and in Qdrant a point of no type converge writes.
func TestIndexDiffFindsEveryDifference(t *testing.T) {
	forEachIndexStore(t, testIndexDiffFindsEveryDifference)
}

func testIndexDiffFindsEveryDifference(t *testing.T, is indexStore) {
	ctx := context.Background()
	p := newPipeline(t)
	store := is.open(t)
	list := is.points(store)
	x, err := newIndex(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	stop := runProjector(t, p, x, "index")
	p.write(t, 60, 20)
	converge(t, p.Pool, store, list, 60*time.Second)
	stop()

	var key string
	if err := p.Pool.QueryRow(ctx, `SELECT key FROM documents WHERE NOT deleted AND chunk_count >= 2 ORDER BY key LIMIT 1`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	pts, err := store.Points(ctx, key, true)
	if err != nil || len(pts) < 2 {
		t.Fatalf("the points of %s: %d, %v", key, len(pts), err)
	}
	upsert := func(pts ...index.Point) {
		t.Helper()
		if err := store.Upsert(ctx, pts); err != nil {
			t.Fatal(err)
		}
	}
	deleteAll := func(key string) {
		t.Helper()
		if err := store.DeleteStale(ctx, []index.Keep{{Key: key}}); err != nil {
			t.Fatal(err)
		}
	}
	orig := pts[1]
	changed := func(change func(*index.Point)) index.Point {
		c := orig
		c.Tags = slices.Clone(orig.Tags)
		change(&c)
		return c
	}
	type damage struct {
		what       string
		make, undo func()
	}
	damages := []damage{
		{"the points of a document deleted", func() { deleteAll(key) }, func() { upsert(pts...) }},
		{"a point of an older version left", func() {
			upsert(changed(func(c *index.Point) { c.ID, c.Version = uuid.New(), orig.Version-1 }))
		}, func() {
			if err := store.DeleteStale(ctx, []index.Keep{{Key: key, Version: orig.Version}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"a point of a key Postgres does not have", func() {
			upsert(changed(func(c *index.Point) { c.ID, c.Key = uuid.New(), "ghost" }))
		}, func() { deleteAll("ghost") }},
	}
	for _, c := range []struct {
		what   string
		change func(*index.Point)
	}{
		{"version", func(c *index.Point) { c.Version++ }},
		{"ordinal", func(c *index.Point) { c.Ordinal += 10 }},
		{"chunk hash", func(c *index.Point) { c.ChunkHash = "damaged" }},
		{"content hash", func(c *index.Point) { c.ContentHash = "damaged" }},
		{"title", func(c *index.Point) { c.Title += " (damaged)" }},
		{"tags", func(c *index.Point) { c.Tags = append(c.Tags, "damaged") }},
		{"text", func(c *index.Point) { c.Text += " damaged" }},
	} {
		damages = append(damages, damage{"another " + c.what, func() { upsert(changed(c.change)) }, func() { upsert(orig) }})
	}
	if is.rest != nil {
		stray := uuid.New()
		vector := make([]float32, dim)
		vector[0] = 1
		damages = append(damages, damage{"a point of another type", func() {
			if err := is.rest.call(ctx, http.MethodPut, "/collections/"+is.collection+"/points?wait=true", map[string]any{"points": []any{
				map[string]any{"id": stray.String(), "vector": vector, "payload": map[string]any{"type": "other", "key": key}}}}, nil); err != nil {
				t.Fatal(err)
			}
		}, func() {
			if err := is.rest.deletePoint(ctx, is.collection, stray); err != nil {
				t.Fatal(err)
			}
		}})
	}
	for _, d := range damages {
		d.make()
		found, err := diff(ctx, p.Pool, store, list)
		if err != nil {
			t.Fatal(err)
		}
		if found == "" {
			t.Errorf("%s: diff finds no difference", d.what)
		}
		d.undo()
		if again, err := diff(ctx, p.Pool, store, list); err != nil || again != "" {
			t.Fatalf("%s undone: %s %v", d.what, again, err)
		}
		t.Logf("%s: %s", d.what, lastBytes(found, 160))
	}
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

// waitRelayed waits until the relay has published the version Postgres
// holds of every document: the last message on each document's subject
// carries it. A consumer with nothing pending has caught up with the
// stream, not with Postgres: the relay may still be starting (its slot
// waits for the transactions running on the whole server) or behind.
func (p *pipeline) waitRelayed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	// behind says what the relay had not published yet.
	behind := func() string {
		s, err := p.JetStream.Stream(ctx, contract.DocsStream)
		if err != nil {
			return err.Error()
		}
		rows, err := p.Pool.Query(ctx, `SELECT key, version FROM documents`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var version int64
			if err := rows.Scan(&key, &version); err != nil {
				t.Fatal(err)
			}
			m, err := s.GetLastMsgForSubject(ctx, contract.Subject(key))
			if err != nil {
				return fmt.Sprintf("%s: %v", key, err)
			}
			ev, err := contract.DecodeEvent(m.Data)
			if err != nil {
				t.Fatalf("the last event of %s: %v", key, err)
			}
			if ev.Version != version {
				return fmt.Sprintf("%s: Postgres has version %d, the stream's last event version %d", key, version, ev.Version)
			}
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return ""
	}
	deadline := time.Now().Add(90 * time.Second)
	for b := behind(); b != ""; b = behind() {
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not publish the last version of every document within 90s: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
// writer keeps writing, and restarted each time; at the end the index,
// read by a fresh process (the embedded index from its files), equals
// Postgres point by point. On the embedded index and on a Qdrant
// collection.
func TestIndexProjectorSurvivesSIGKILL(t *testing.T) {
	forEachIndexStore(t, testIndexProjectorSurvivesSIGKILL)
}

func testIndexProjectorSurvivesSIGKILL(t *testing.T, is indexStore) {
	p := newPipeline(t)
	kills := crashProjector(t, p, "index", is.env...)
	store := is.open(t)
	if d, err := diff(context.Background(), p.Pool, store, is.points(store)); err != nil || d != "" {
		t.Fatalf("after %d SIGKILLs: %s %v", kills, d, err)
	}
	var docs, chunks int
	_ = p.Pool.QueryRow(context.Background(), `SELECT count(*), (SELECT count(*) FROM chunks) FROM documents`).Scan(&docs, &chunks)
	t.Logf("%d SIGKILLs of the projector; the index equals Postgres on all %d documents and %d chunks", kills, docs, chunks)
}

// crashProjector runs a projector of kind ("index" or "graph") in a child
// process on the store storeEnv names (CONVERGE_DATA_DIR; or
// CONVERGE_NEO4J_URL and its credentials, CONVERGE_QDRANT_URL and its
// collection and key), SIGKILLs it at random points while the writer writes
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
	p.waitRelayed(t)
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
