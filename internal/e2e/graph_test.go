//go:build linux

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// runGraphChild projects CONVERGE_NATS_URL's stream into Neo4j at
// CONVERGE_NEO4J_URL (with CONVERGE_NEO4J_USER and _PASSWORD) or, when
// that is unset, the embedded graph in CONVERGE_DATA_DIR, until SIGTERM (or
// SIGKILL).
func runGraphChild() int {
	return runChild("graph", func(ctx context.Context) (projector.Store, func() error, error) {
		var store graph.Backend
		var err error
		if url := os.Getenv("CONVERGE_NEO4J_URL"); url != "" {
			store, err = neo4j.New(ctx, neo4j.Config{URL: url, User: os.Getenv("CONVERGE_NEO4J_USER"),
				Password: os.Getenv("CONVERGE_NEO4J_PASSWORD")})
		} else {
			store, err = graphembedded.Open(os.Getenv("CONVERGE_DATA_DIR"), graphembedded.Options{})
		}
		if err != nil {
			return nil, nil, err
		}
		p, err := graph.New(ctx, store)
		if err != nil {
			_ = store.Close()
			return nil, nil, err
		}
		return p, store.Close, nil
	})
}

// graphDiff compares the graph with Postgres and returns the first
// difference, or "" when they agree on every document: its node (version,
// tombstone, title, content hash), its chunks (ids, ordinals, hashes), its
// links out and tags, the links into it; every link target Postgres does
// not have is a stub; and the graph has no written document Postgres does
// not have.
func graphDiff(ctx context.Context, pool *pgxpool.Pool, b graph.Backend) (string, error) {
	type doc struct {
		version     int64
		deleted     bool
		title, hash string
		links, tags []string
		chunks      []graph.Chunk
	}
	docs := map[string]*doc{}
	rows, err := pool.Query(ctx, `SELECT key, version, deleted, title, content_hash, links, tags FROM documents`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		d := &doc{}
		var key string
		if err := rows.Scan(&key, &d.version, &d.deleted, &d.title, &d.hash, &d.links, &d.tags); err != nil {
			return "", err
		}
		if d.deleted {
			d.title, d.links, d.tags = "", nil, nil
		}
		slices.Sort(d.links)
		slices.Sort(d.tags)
		docs[key] = d
	}
	if rows.Err() != nil {
		return "", rows.Err()
	}
	rows, err = pool.Query(ctx, `SELECT id, key, ordinal, content_hash FROM chunks ORDER BY key, ordinal`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var c graph.Chunk
		var key string
		if err := rows.Scan(&c.ID, &key, &c.Ordinal, &c.ContentHash); err != nil {
			return "", err
		}
		docs[key].chunks = append(docs[key].chunks, c)
	}
	if rows.Err() != nil {
		return "", rows.Err()
	}
	in := map[string][]string{}
	for key, d := range docs {
		for _, l := range d.links {
			in[l] = append(in[l], key)
		}
	}
	for _, ks := range in {
		slices.Sort(ks)
	}
	eq := func(a, b []string) bool { return slices.Equal(nonNil(a), nonNil(b)) }
	for key, d := range docs {
		v, ok, err := b.Document(ctx, key)
		if err != nil {
			return "", err
		}
		if !ok || v.Stub {
			return fmt.Sprintf("%s: Postgres has version %d, the graph has no written node (present %v)", key, d.version, ok), nil
		}
		if v.Version != d.version || v.Deleted != d.deleted || v.Title != d.title || v.ContentHash != d.hash {
			return fmt.Sprintf("%s: graph node v%d deleted %v %q %s, Postgres v%d deleted %v %q %s", key, v.Version, v.Deleted, v.Title,
				v.ContentHash, d.version, d.deleted, d.title, d.hash), nil
		}
		if !eq(v.Links, d.links) || !eq(v.Tags, d.tags) || !eq(v.LinkedBy, in[key]) {
			return fmt.Sprintf("%s: graph links %v tags %v linked by %v; Postgres links %v tags %v linked by %v", key,
				v.Links, v.Tags, v.LinkedBy, d.links, d.tags, in[key]), nil
		}
		if !slices.Equal(v.Chunks, d.chunks) {
			return fmt.Sprintf("%s: graph chunks %v, Postgres %v", key, v.Chunks, d.chunks), nil
		}
	}
	for target, from := range in {
		if _, ok := docs[target]; ok {
			continue
		}
		v, ok, err := b.Document(ctx, target)
		if err != nil {
			return "", err
		}
		if !ok || !v.Stub || !eq(v.LinkedBy, from) {
			return fmt.Sprintf("%s: linked by %v in Postgres; in the graph present %v stub %v linked by %v", target, from, ok, v.Stub, v.LinkedBy), nil
		}
	}
	extra := ""
	err = b.ScanDocuments(ctx, func(v graph.View) error {
		if _, ok := docs[v.Key]; !ok && !v.Stub && extra == "" {
			extra = fmt.Sprintf("%s: written in the graph (version %d), not in Postgres", v.Key, v.Version)
		}
		return nil
	})
	return extra, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func convergeGraph(t *testing.T, pool *pgxpool.Pool, b graph.Backend, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, err := graphDiff(context.Background(), pool, b)
		if err != nil {
			t.Fatal(err)
		}
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the graph did not converge within %v: %s", timeout, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func openGraph(t *testing.T, dir string) *graphembedded.Store {
	t.Helper()
	s, err := graphembedded.Open(dir, graphembedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// graphStore is a graph backend the end-to-end tests run on: the embedded
// graph in a directory, or an emptied instance of the test Neo4j server.
type graphStore struct {
	// open opens the store (again: the same graph each time); it is
	// closed when the test ends.
	open func(t *testing.T) graph.Backend
	// env names the store to a child process (runGraphChild).
	env []string
}

// forEachGraphStore runs fn as a subtest on each graph backend.
func forEachGraphStore(t *testing.T, fn func(t *testing.T, gs graphStore)) {
	t.Run("embedded", func(t *testing.T) {
		dir := t.TempDir()
		fn(t, graphStore{env: []string{"CONVERGE_DATA_DIR=" + dir}, open: func(t *testing.T) graph.Backend {
			s := openGraph(t, dir)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}})
	})
	t.Run("neo4j", func(t *testing.T) {
		n := testenv.LeaseNeo4j(t)
		env := []string{"CONVERGE_NEO4J_URL=" + n.URL, "CONVERGE_NEO4J_USER=" + n.User, "CONVERGE_NEO4J_PASSWORD=" + n.Password}
		fn(t, graphStore{env: env, open: func(t *testing.T) graph.Backend {
			b, err := neo4j.New(context.Background(), neo4j.Config{URL: n.URL, User: n.User, Password: n.Password})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		}})
	})
}

// The graph converges to Postgres; every message is then delivered twice
// more (two replays of the whole stream), an older version is published
// after its successor, and a poison message arrives: the graph still
// equals Postgres, and the poison is dead-lettered with its reason.
func TestGraphConvergesUnderRedeliveryReorderAndPoison(t *testing.T) {
	forEachGraphStore(t, testGraphConvergesUnderRedeliveryReorderAndPoison)
}

func testGraphConvergesUnderRedeliveryReorderAndPoison(t *testing.T, gs graphStore) {
	p := newPipeline(t)
	store := gs.open(t)
	g, err := graph.New(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	stop := runProjector(t, p, g, "graph")
	p.write(t, 600, 80)
	convergeGraph(t, p.Pool, store, 60*time.Second)
	stop()

	for pass := 2; pass <= 3; pass++ {
		name := fmt.Sprintf("graph-pass-%d", pass)
		stop := runProjector(t, p, g, name)
		testenv.Eventually(t, "the replay to catch up", 60*time.Second, func() bool { return caughtUp(t, p.JetStream, name) })
		stop()
		if d, err := graphDiff(context.Background(), p.Pool, store); err != nil || d != "" {
			t.Fatalf("after delivery %d of every message: %s %v", pass, d, err)
		}
	}

	var key string
	var version int64
	if err := p.Pool.QueryRow(context.Background(), `SELECT key, version FROM documents WHERE NOT deleted ORDER BY key LIMIT 1`).Scan(&key, &version); err != nil {
		t.Fatal(err)
	}
	d, _ := contract.Document{Key: key, Version: version - 1, Title: "stale", Body: "a stale body", Links: []string{"stale-target"}}.Normalize()
	stale := contract.NewUpsertedEvent(d, []string{d.Body})
	data, _ := stale.Encode()
	if _, err := p.JetStream.Publish(context.Background(), contract.Subject(key), data); err != nil {
		t.Fatal(err)
	}
	if _, err := p.JetStream.Publish(context.Background(), contract.Subject("poison"), []byte(`{"schema":"converge.event.v1"}`)); err != nil {
		t.Fatal(err)
	}
	stop = runProjector(t, p, g, "graph")
	p.write(t, 100, 80)
	convergeGraph(t, p.Pool, store, 60*time.Second)
	testenv.Eventually(t, "the poison message's dead letter", 10*time.Second, func() bool {
		s, err := p.JetStream.Stream(context.Background(), deadletter.Stream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(context.Background(), contract.DLQSubject("graph"))
		return err == nil && m.Header.Get(deadletter.HeaderCode) == "undecodable"
	})
	stop()
	if _, ok, _ := store.Document(context.Background(), "stale-target"); ok {
		t.Fatal("the stale version's link created a node")
	}
	if d, err := graphDiff(context.Background(), p.Pool, store); err != nil || d != "" {
		t.Fatalf("at the end: %s %v", d, err)
	}
}

// A graph projector in a child process is SIGKILLed at random points
// while the writer keeps writing, and restarted each time; at the end the
// graph, read by a fresh connection (the embedded graph from its files),
// equals Postgres node by node and edge by edge.
func TestGraphProjectorSurvivesSIGKILL(t *testing.T) {
	forEachGraphStore(t, testGraphProjectorSurvivesSIGKILL)
}

func testGraphProjectorSurvivesSIGKILL(t *testing.T, gs graphStore) {
	p := newPipeline(t)
	kills := crashProjector(t, p, "graph", gs.env...)
	store := gs.open(t)
	if d, err := graphDiff(context.Background(), p.Pool, store); err != nil || d != "" {
		t.Fatalf("after %d SIGKILLs: %s %v", kills, d, err)
	}
	var docs, links int
	_ = p.Pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(cardinality(links)), 0) FROM documents`).Scan(&docs, &links)
	t.Logf("%d SIGKILLs of the projector; the graph equals Postgres on all %d documents and %d links", kills, docs, links)
}
