package neo4j

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/pkg/contract"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// golden compares got with testdata/name.golden, or rewrites the file
// with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the plan (review, then go test -update):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestStatementsGolden pins the text of every Cypher statement.
func TestStatementsGolden(t *testing.T) {
	var b strings.Builder
	for _, s := range statementNames {
		fmt.Fprintf(&b, "== %s\n%s\n\n", s.name, strings.TrimSpace(s.cypher))
	}
	golden(t, "statements", b.String())
}

// doc is an upsert of key at version with n chunks.
func doc(key string, version int64, n int, links, tags []string) graph.Doc {
	d := graph.Doc{Key: key, Version: version, Title: fmt.Sprintf("%s v%d", key, version),
		ContentHash: fmt.Sprintf("doc-%s-%d", key, version), Links: links, Tags: tags}
	for i := range n {
		d.Chunks = append(d.Chunks, graph.Chunk{ID: contract.ChunkID(key, version, i), Ordinal: i,
			ContentHash: fmt.Sprintf("chunk-%s-%d-%d", key, version, i)})
	}
	return d
}

func repaired(d graph.Doc) graph.Doc {
	d.Repair = true
	return d
}

func withdrawal(key string, version int64) graph.Doc {
	return graph.Doc{Key: key, Version: version, Deleted: true, ContentHash: fmt.Sprintf("withdrawn-%s", key)}
}

// plannedTx is one transaction of an Apply as planned when the graph
// holds a newer version of the keys in stale and nothing of the others.
type plannedTx struct {
	statements []statement // in the order they run
	applied    []string    // keys the guard answers applied
	skipped    []string    // keys the guard answers not applied
	rows       []docRow    // the applied documents, whose counts the fence expects
}

// planTransactions returns the transactions of Apply(docs) with
// batchSize, their statements carrying the parameters the backend sends.
func planTransactions(t *testing.T, docs []graph.Doc, batchSize int, stale ...string) []plannedTx {
	t.Helper()
	batches, err := planBatches(docs, batchSize)
	if err != nil {
		t.Fatal(err)
	}
	var out []plannedTx
	for _, batch := range batches {
		// readBatch finds the stale keys at a newer version, the
		// others not at all.
		held := map[string]heldDoc{}
		for _, r := range batch {
			if contains(stale, r.doc.Key) {
				held[r.doc.Key] = heldDoc{versioned: true, version: r.doc.Version + 1}
			}
		}
		p := plannedTx{statements: []statement{readStatement(batch)}}
		p.statements = append(p.statements, writeStatement(batch, held))
		flags := make([]bool, len(batch))
		for j, r := range batch {
			flags[j] = !contains(stale, r.doc.Key)
			if flags[j] {
				p.applied = append(p.applied, r.doc.Key)
			} else {
				p.skipped = append(p.skipped, r.doc.Key)
			}
		}
		for j, r := range batch {
			if flags[j] {
				p.rows = append(p.rows, r)
			}
		}
		out = append(out, p)
	}
	return out
}

// renderPlan writes out the statements of Apply(docs), as the transactions
// would run them when the guard answers applied for the keys not in stale.
func renderPlan(t *testing.T, docs []graph.Doc, batchSize int, stale ...string) string {
	t.Helper()
	txs := planTransactions(t, docs, batchSize, stale...)
	var b strings.Builder
	for i, p := range txs {
		fmt.Fprintf(&b, "######## transaction %d of %d\n", i+1, len(txs))
		for _, st := range p.statements {
			renderStatement(t, &b, st)
		}
		fmt.Fprintf(&b, "# guard answers: applied %v, not applied %v\n", p.applied, p.skipped)
		if len(p.rows) == 0 {
			continue
		}
		fmt.Fprint(&b, "# fence expects:")
		for _, r := range p.rows {
			c := r.counts()
			fmt.Fprintf(&b, " %s=%d/%d/%d", r.doc.Key, c.Chunks, c.Links, c.Tags)
		}
		fmt.Fprint(&b, " (HAS_CHUNK/LINKS_TO/TAGGED)\n")
	}
	return b.String()
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func renderStatement(t *testing.T, b *strings.Builder, st statement) {
	t.Helper()
	if statementName(st.cypher) != st.name {
		t.Fatalf("statement %s carries the Cypher of %q", st.name, statementName(st.cypher))
	}
	params, err := json.MarshalIndent(st.params, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(b, "== %s\n%s\n", st.name, params)
}

// planScenarios are representative Apply calls: each has a golden file
// of its plan (TestPlanGolden), and each statement of its plan is run
// with EXPLAIN on the test server (TestStatementsExplain).
var planScenarios = []struct {
	name  string
	docs  []graph.Doc
	batch int
	stale []string // keys the graph holds a newer version of
}{
	// A new document: its node, 2 chunks, links and tags given
	// unsorted (the plan sorts them).
	{"new_document", []graph.Doc{doc("a", 1, 2, []string{"c", "b"}, []string{"y", "x"})}, 100, nil},
	// Version 2 with fewer chunks, one link left, no tags: the old
	// chunks and edges are deleted, only the new ones merged.
	{"update_fewer_chunks", []graph.Doc{doc("a", 2, 1, []string{"b"}, nil)}, 100, nil},
	// A withdrawal: node fields set, chunks and outgoing edges
	// deleted, nothing merged; the fence expects zero of each.
	{"withdrawal", []graph.Doc{withdrawal("a", 3)}, 100, nil},
	// Links to keys not yet seen (y, z) and to documents of the same
	// batch (a, b): one MERGE per distinct target.
	{"links_to_unseen", []graph.Doc{
		doc("b", 1, 0, []string{"a", "y"}, nil),
		doc("a", 1, 0, []string{"b", "z"}, nil),
	}, 100, nil},
	// Shared tags: one Tag MERGE per distinct name.
	{"tags", []graph.Doc{
		doc("a", 1, 1, nil, []string{"graph", "go"}),
		doc("b", 1, 1, nil, []string{"neo4j", "graph"}),
	}, 100, nil},
	// Five documents, BatchSize 2: three transactions in key order.
	{"batch_split", []graph.Doc{
		doc("e", 1, 1, []string{"a"}, nil),
		doc("c", 1, 1, nil, []string{"t"}),
		doc("a", 1, 1, []string{"e"}, nil),
		withdrawal("d", 4),
		doc("b", 1, 1, nil, nil),
	}, 2, nil},
	// The guard answers b not applied (the graph holds a newer b):
	// nothing of b is written, not even the stub of its link.
	{"stale_skipped", []graph.Doc{
		doc("a", 2, 1, []string{"x"}, nil),
		doc("b", 1, 1, []string{"y"}, []string{"t"}),
	}, 100, []string{"b"}},
	// Nothing applied: the transaction is the guard alone.
	{"all_stale", []graph.Doc{doc("a", 1, 1, []string{"x"}, nil)}, 100, []string{"a"}},
	// A repair (a re-emitted event) beside a plain write: the guard
	// rows say which is which; an applied repair replaces the
	// document's chunks and edges like any applied version.
	{"repair", []graph.Doc{repaired(doc("a", 2, 2, []string{"b"}, []string{"t"})), doc("c", 1, 1, nil, nil)}, 100, nil},
}

// TestPlanGolden pins the statements and parameters of representative
// batches; review testdata/*.golden by eye after -update.
func TestPlanGolden(t *testing.T) {
	for _, c := range planScenarios {
		t.Run(c.name, func(t *testing.T) {
			golden(t, c.name, renderPlan(t, c.docs, c.batch, c.stale...))
		})
	}
}

func TestPlanBatchesValidates(t *testing.T) {
	id := contract.ChunkID("a", 1, 0)
	for _, c := range []struct {
		name string
		docs []graph.Doc
	}{
		{"empty key", []graph.Doc{{Version: 1}}},
		{"repeated key", []graph.Doc{doc("a", 1, 0, nil, nil), doc("b", 1, 0, nil, nil), doc("a", 2, 0, nil, nil)}},
		{"empty link", []graph.Doc{doc("a", 1, 0, []string{"", "b"}, nil)}},
		{"empty tag", []graph.Doc{doc("a", 1, 0, nil, []string{""})}},
		{"chunk without id", []graph.Doc{{Key: "a", Version: 1, Chunks: []graph.Chunk{{Ordinal: 0}}}}},
		{"repeated chunk id", []graph.Doc{{Key: "a", Version: 1, Chunks: []graph.Chunk{{ID: id}, {ID: id, Ordinal: 1}}}}},
	} {
		if _, err := planBatches(c.docs, 10); !errors.Is(err, ErrInvalidDocs) {
			t.Errorf("%s: err = %v, want ErrInvalidDocs", c.name, err)
		}
	}
}

func TestPlanBatchesNormalisesCopies(t *testing.T) {
	links, tags := []string{"c", "b", "c"}, []string{"y", "x", "x"}
	w := withdrawal("w", 2)
	w.Links, w.Tags, w.Chunks = []string{"stray"}, []string{"stray"}, doc("w", 2, 1, nil, nil).Chunks
	batches, err := planBatches([]graph.Doc{doc("a", 1, 0, links, tags), w}, 10)
	if err != nil {
		t.Fatal(err)
	}
	a, wr := batches[0][0].doc, batches[0][1].doc
	if fmt.Sprint(a.Links, a.Tags) != "[b c] [x y]" {
		t.Errorf("links %v tags %v, want sorted and distinct", a.Links, a.Tags)
	}
	if fmt.Sprint(links, tags) != "[c b c] [y x x]" {
		t.Errorf("the caller's slices were modified: %v %v", links, tags)
	}
	if wr.Chunks != nil || wr.Links != nil || wr.Tags != nil {
		t.Errorf("a withdrawal kept %v %v %v", wr.Chunks, wr.Links, wr.Tags)
	}
}

// writeResult maps the answer back to the batch's order, and fails on a
// fence mismatch of an applied document (a document not applied keeps
// whatever it has), or on an answer that is malformed, incomplete or
// repeated.
func TestWriteResult(t *testing.T) {
	batches, err := planBatches([]graph.Doc{
		doc("b", 1, 0, nil, []string{"t"}),
		doc("a", 1, 2, []string{"x"}, nil),
		doc("c", 1, 1, nil, nil),
	}, 10)
	if err != nil {
		t.Fatal(err)
	}
	rows := batches[0] // a b c
	answer := func(key string, applied bool, chunks, links, tags int64) record {
		return record{"key": key, "applied": applied, "chunks": chunks, "links": links, "tags": tags}
	}
	good := []record{answer("c", false, 5, 5, 5), answer("b", true, 0, 0, 1), answer("a", true, 2, 1, 0)}
	got, err := writeResult(rows, good)
	if err != nil || fmt.Sprint(got) != "[true true false]" {
		t.Fatalf("writeResult = %v, %v; want [true true false] (a, b, c)", got, err)
	}
	var fe *FenceError
	bad := []record{good[0], good[1], answer("a", true, 3, 1, 0)}
	if _, err := writeResult(rows, bad); !errors.As(err, &fe) || fe.Key != "a" || fe.Have.Chunks != 3 || fe.Want.Chunks != 2 {
		t.Fatalf("a with 3 chunks: %v", err)
	}
	bad = []record{good[0], answer("b", true, 0, 1, 1), answer("a", true, 3, 1, 0)}
	if _, err := writeResult(rows, bad); !errors.As(err, &fe) || fe.Key != "a" {
		t.Fatalf("a and b both differ: %v; want the first by key, a", err)
	}
	for _, recs := range [][]record{
		good[:2],
		append(slices.Clone(good), answer("d", true, 0, 0, 0)),
		append(slices.Clone(good), good[2]),
		{good[0], good[1], {"key": "a", "applied": "yes", "chunks": int64(2), "links": int64(1), "tags": int64(0)}},
		{good[0], good[1], {"key": "a", "applied": true, "chunks": 2, "links": int64(1), "tags": int64(0)}},
	} {
		if _, err := writeResult(rows, recs); err == nil || errors.As(err, &fe) {
			t.Errorf("writeResult(%v) = %v, want an error other than a fence mismatch", recs, err)
		}
	}
}

// The locks cover the old and new link targets and tags of every
// document the guard will apply, documents before tags, each sorted; a
// document the graph holds at its version (unless a repair) or a newer
// one adds only its own node.
func TestLockSets(t *testing.T) {
	batches, err := planBatches([]graph.Doc{
		doc("b", 2, 0, []string{"z", "c"}, []string{"t2"}),
		doc("a", 1, 0, []string{"x"}, []string{"t9"}),
		repaired(doc("r", 3, 0, []string{"q"}, []string{"t4"})),
		doc("n", 1, 0, []string{"m"}, []string{"t1"}),
	}, 10)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]heldDoc{
		"b": {versioned: true, version: 1, links: []string{"old"}, tags: []string{"t0"}},
		"a": {versioned: true, version: 1, links: []string{"y"}, tags: []string{"t8"}}, // stale: held at its version
		"r": {versioned: true, version: 3},
		// n is new: not held at all.
	}
	st := writeStatement(batches[0], held)
	got := fmt.Sprint(st.params["keys"], st.params["names"])
	if want := "[a b c m n old q r z] [t0 t1 t2 t4]"; got != want {
		t.Fatalf("locks %v\nwant  %v", got, want)
	}
}

func TestReadResult(t *testing.T) {
	held, err := readResult([]record{
		{"key": "a", "version": int64(3), "links": []any{"b"}, "tags": []any{"t"}},
		{"key": "s", "version": nil, "links": []any{}, "tags": []any{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if a := held["a"]; !a.versioned || a.version != 3 || fmt.Sprint(a.links, a.tags) != "[b] [t]" {
		t.Errorf("a = %+v", a)
	}
	if s := held["s"]; s.versioned {
		t.Errorf("the stub s = %+v, want no version", s)
	}
	for _, bad := range []record{{"key": 1}, {"key": "a", "version": "3"}, {"key": "a", "links": []any{1}}} {
		if _, err := readResult([]record{bad}); err == nil {
			t.Errorf("readResult accepted %v", bad)
		}
	}
}
