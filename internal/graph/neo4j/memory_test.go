package neo4j

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/testenv"
)

// txMemory is the transaction memory bound (db.memory.transaction.max)
// of the server of TestBoundedTransactionMemory.
const txMemory = 2 << 20

// TestBoundedTransactionMemory runs, on a server of its own whose
// transactions may use at most txMemory bytes, the writes that such a
// bound stops when they are too large for one transaction.
func TestBoundedTransactionMemory(t *testing.T) {
	t.Parallel() // most of it is the server's start, which need not wait
	n := testenv.StartNeo4j(t, testenv.Neo4jOptions{TxMemory: txMemory})
	// A short retry time: without the fixes these tests pin, each
	// failure is the driver giving up after it.
	b, err := New(ctx(), Config{URL: n.URL, User: n.User, Password: n.Password, MaxRetryTime: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	// The wipe first: deleting the large documents of the other test
	// needs memory of its own.
	t.Run("WipeLargeFanIn", func(t *testing.T) { testWipeLargeFanIn(t, b) })
	t.Run("OversizedBatchIsSplit", func(t *testing.T) { testOversizedBatch(t, b) })
}

// A batch past the server's transaction memory is written in smaller
// transactions; a single document past it fails at once, permanently,
// instead of being retried as the transient error the server calls it.
// Without the split, the batch failed after the driver's retries with
// Neo.TransientError.General.MemoryPoolOutOfMemoryError, not permanent,
// so the projector retried it forever.
func testOversizedBatch(t *testing.T, b *Backend) {
	counts := newCountingRunner(b.run)
	b.run = counts
	defer func() { b.run = counts.runner }()
	// A string parameter takes about twice its length in the server's
	// memory: 16 such titles need four times the bound.
	title := strings.Repeat("x", txMemory/8)
	docs := make([]graph.Doc, 16)
	for i := range docs {
		docs[i] = doc(fmt.Sprintf("big-%02d", i), 1, 1, nil, []string{"t"})
		docs[i].Title = title
	}
	applied, err := b.Apply(ctx(), docs)
	if err != nil {
		t.Fatalf("Apply of %d documents of %d KiB: %v", len(docs), len(title)>>10, err)
	}
	for i, ok := range applied {
		if !ok {
			t.Fatalf("document %d not applied", i)
		}
	}
	t.Logf("%d documents of %d KiB: %d transaction attempts, failed by code %v", len(docs), len(title)>>10,
		counts.attempts.Load(), counts.failures)
	if counts.attempts.Load() < 3 {
		t.Errorf("%d attempts: the batch was not split", counts.attempts.Load())
	}
	if v, ok, err := b.Document(ctx(), "big-15"); err != nil || !ok || v.Title != title || len(v.Chunks) != 1 {
		t.Fatalf("Document(big-15): ok %v, err %v, title of %d bytes, %d chunks", ok, err, len(v.Title), len(v.Chunks))
	}

	before := counts.attempts.Load()
	huge := doc("huge", 1, 1, nil, nil)
	huge.Title = strings.Repeat("y", txMemory/2)
	_, err = b.Apply(ctx(), []graph.Doc{huge})
	var e *Error
	if !errors.As(err, &e) || !e.Permanent() || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Apply of one document of %d MiB: %v; want a permanent ErrTooLarge", len(huge.Title)>>20, err)
	}
	if e.Code() != "Neo.TransientError.General.MemoryPoolOutOfMemoryError" {
		t.Errorf("code %q", e.Code())
	}
	if n := counts.attempts.Load() - before; n != 1 {
		t.Errorf("%d attempts of a document too large; want 1", n)
	}
	if _, ok, _ := b.Document(ctx(), "huge"); ok {
		t.Error("the document too large was written")
	}
}

// fanIn documents tagged with one tag and linking to one document: a
// wipe deleting that tag or that document with its relationships would
// delete all of theirs in one transaction.
const fanIn = 5000

// Without deleting the relationships first, the wipe's first transaction
// failed with Neo.TransientError.General.MemoryPoolOutOfMemoryError,
// retried until the driver gave up (the rebuild would retry it forever);
// halving the transactions does not help, as the tag alone is too large.
// Without the halving, a transaction of BatchSize*10 relationships is
// itself too large for this bound.
func testWipeLargeFanIn(t *testing.T, b *Backend) {
	_, err := neo4j.ExecuteQuery(ctx(), b.driver, `MERGE (:Tag {name: 'common'}) MERGE (:Document {key: 'hub', stub: true})`,
		nil, neo4j.EagerResultTransformer)
	if err != nil {
		t.Fatal(err)
	}
	// Written in transactions of their own: the bound applies here too.
	// CALL ... IN TRANSACTIONS runs only in an implicit transaction.
	session := b.driver.NewSession(ctx(), neo4j.SessionConfig{})
	defer func() { _ = session.Close(ctx()) }()
	res, err := session.Run(ctx(), `UNWIND range(1, $n) AS i
CALL { WITH i
  MATCH (t:Tag {name: 'common'}), (h:Document {key: 'hub'})
  CREATE (d:Document {key: 'd' + i, version: 1})-[:TAGGED]->(t), (d)-[:LINKS_TO]->(h)
} IN TRANSACTIONS OF 200 ROWS`, map[string]any{"n": int64(fanIn)})
	if err == nil {
		_, err = res.Consume(ctx())
	}
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deleted, err := b.Wipe(ctx())
	if err != nil {
		t.Fatalf("Wipe: %v", err)
	}
	t.Logf("wiped %d nodes in %v", deleted, time.Since(start).Round(time.Millisecond))
	if deleted < fanIn+2 {
		t.Errorf("Wipe deleted %d nodes; want at least %d", deleted, fanIn+2)
	}
	left := 0
	if err := b.ScanDocuments(ctx(), func(graph.View) error { left++; return nil }); err != nil || left != 0 {
		t.Fatalf("%d documents after the wipe (%v)", left, err)
	}
}
