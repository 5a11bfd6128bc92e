package neo4j

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/graph"
)

var (
	deadlock    = &neo4j.Neo4jError{Code: "Neo.TransientError.Transaction.DeadlockDetected", Msg: "deadlock"}
	syntaxError = &neo4j.Neo4jError{Code: "Neo.ClientError.Statement.SyntaxError", Msg: "bad Cypher"}
)

func ctx() context.Context { return context.Background() }

func mustApply(t *testing.T, b *Backend, docs ...graph.Doc) []bool {
	t.Helper()
	applied, err := b.Apply(ctx(), docs)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return applied
}

func names(calls []call) string {
	var out []string
	for _, c := range calls {
		out = append(out, c.name)
	}
	return strings.Join(out, " ")
}

// guardKeys are the keys of the guard among a transaction's calls.
func guardKeys(calls []call) []string {
	var keys []string
	i := slices.IndexFunc(calls, func(c call) bool { return c.name == "writeDocuments" })
	if i < 0 {
		return nil
	}
	for _, row := range calls[i].params["rows"].([]map[string]any) {
		keys = append(keys, row["key"].(string))
	}
	return keys
}

// A deadlock on the first attempt rolls it back; the managed transaction
// (the driver's, modelled by fakeRunner) runs the work again from
// scratch, and the second attempt commits.
func TestApplyRetriesTransientError(t *testing.T) {
	r := newFakeRunner()
	r.fail = func(_, try int, name string) error {
		if try == 1 && name == "writeDocuments" {
			return deadlock
		}
		return nil
	}
	b := newTestBackend(r, 100)
	docs := []graph.Doc{doc("b", 1, 1, []string{"a"}, nil), doc("a", 1, 2, []string{"b"}, []string{"t"})}
	if got := mustApply(t, b, docs...); !slices.Equal(got, []bool{true, true}) {
		t.Fatalf("applied = %v, want [true true]", got)
	}
	if len(r.attempts) != 2 || r.attempts[0].committed || !r.attempts[1].committed {
		t.Fatalf("attempts = %+v, want a rolled back one, then a committed one", r.attempts)
	}
	if !errors.Is(r.attempts[0].err, deadlock) {
		t.Fatalf("first attempt failed with %v", r.attempts[0].err)
	}
	if got, want := names(r.attempts[1].calls), "readBatch writeDocuments"; got != want {
		t.Fatalf("second attempt ran %s, want %s", got, want)
	}
	for _, d := range docs {
		v, ok, err := b.Document(ctx(), d.Key)
		if err != nil || !ok || v.Version != 1 || len(v.Chunks) != len(d.Chunks) {
			t.Fatalf("Document(%s) = %+v, %v, %v", d.Key, v, ok, err)
		}
	}
}

// A transient error on every attempt ends when the runner gives up, with
// the error classified as not permanent.
func TestApplyTransientErrorsExhausted(t *testing.T) {
	r := newFakeRunner()
	r.fail = func(_, _ int, name string) error {
		if name == "writeDocuments" {
			return deadlock
		}
		return nil
	}
	_, err := newTestBackend(r, 100).Apply(ctx(), []graph.Doc{doc("a", 1, 1, nil, nil)})
	var e *Error
	if !errors.As(err, &e) || e.Permanent() || e.Code() != deadlock.Code || e.Op != "apply" {
		t.Fatalf("err = %v, want a transient *Error", err)
	}
	if len(r.attempts) != r.maxAttempts {
		t.Fatalf("%d attempts, want %d", len(r.attempts), r.maxAttempts)
	}
}

// An error mid-batch rolls the whole batch back and Apply returns it.
func TestApplyErrorMidBatchRollsBack(t *testing.T) {
	r := newFakeRunner()
	r.fail = func(_, _ int, name string) error {
		if name == "writeDocuments" {
			return syntaxError
		}
		return nil
	}
	b := newTestBackend(r, 100)
	applied, err := b.Apply(ctx(), []graph.Doc{doc("a", 1, 1, []string{"x"}, []string{"t"}), doc("b", 1, 1, nil, nil)})
	if applied != nil {
		t.Fatalf("applied = %v on an error", applied)
	}
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, syntaxError) {
		t.Fatalf("err = %v, want an *Error caused by the syntax error", err)
	}
	if !e.Permanent() || !strings.Contains(err.Error(), "writeDocuments") || !strings.Contains(err.Error(), `database "neo4j"`) {
		t.Fatalf("err = %v (permanent %v): want permanent, naming the statement and the database", err, e.Permanent())
	}
	if got := r.committed(); len(got) != 0 {
		t.Fatalf("committed %d transactions, want none", len(got))
	}
	if len(r.attempts) != 1 {
		t.Fatalf("%d attempts of a non-retryable error, want 1", len(r.attempts))
	}
	for _, key := range []string{"a", "b", "x"} {
		if _, ok, err := b.Document(ctx(), key); ok || err != nil {
			t.Fatalf("Document(%s) after the rollback: ok %v, err %v", key, ok, err)
		}
	}
}

// BatchSize 2 and 5 documents: 3 transactions, in sorted key order, the
// applied flags mapped back to the input order.
func TestApplyBatchBoundariesAndInputOrder(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 2)
	mustApply(t, b, doc("d", 5, 1, nil, nil)) // d at version 5: the v3 below is stale
	r.attempts = nil

	docs := []graph.Doc{
		doc("e", 1, 1, []string{"a"}, nil),
		doc("c", 1, 0, nil, []string{"t"}),
		doc("a", 1, 2, nil, nil),
		doc("d", 3, 1, nil, nil),
		withdrawal("b", 1),
	}
	applied := mustApply(t, b, docs...)
	if want := []bool{true, true, true, false, true}; !slices.Equal(applied, want) {
		t.Fatalf("applied = %v, want %v (input order e c a d b)", applied, want)
	}
	txs := r.committed()
	if len(txs) != 3 {
		t.Fatalf("%d transactions, want 3", len(txs))
	}
	for i, want := range []string{"[a b]", "[c d]", "[e]"} {
		if got := fmt.Sprint(guardKeys(txs[i])); got != want {
			t.Errorf("transaction %d guards %s, want %s", i+1, got, want)
		}
	}
	// The second transaction writes c only: d is stale, and keeps
	// version 5's chunk.
	v, _, _ := b.Document(ctx(), "d")
	if want := doc("d", 5, 1, nil, nil).Chunks; v.Version != 5 || fmt.Sprint(v.Chunks) != fmt.Sprint(want) {
		t.Fatalf("d = %+v after a stale v3, want version 5 with chunks %v", v, want)
	}
}

// A batch failing after earlier batches committed: those stay, Apply
// returns the error.
func TestApplyLaterBatchFails(t *testing.T) {
	r := newFakeRunner()
	r.fail = func(n, _ int, name string) error {
		if n == 2 && name == "writeDocuments" {
			return syntaxError
		}
		return nil
	}
	b := newTestBackend(r, 2)
	if _, err := b.Apply(ctx(), []graph.Doc{doc("a", 1, 0, nil, nil), doc("b", 1, 0, nil, nil), doc("c", 1, 0, nil, nil)}); err == nil {
		t.Fatal("Apply succeeded")
	}
	if got := r.committed(); len(got) != 1 || fmt.Sprint(guardKeys(got[0])) != "[a b]" {
		t.Fatalf("committed %v, want the first batch only", got)
	}
	if _, ok, _ := b.Document(ctx(), "c"); ok {
		t.Fatal("c of the failed batch was written")
	}
}

// A fence mismatch rolls back and names the key and the numbers; it is
// not permanent.
func TestApplyFenceMismatch(t *testing.T) {
	r := newFakeRunner()
	r.answer = func(name string, recs []record) []record {
		if name != "writeDocuments" {
			return recs
		}
		for _, rec := range recs {
			if rec["key"] == "b" {
				rec["links"] = rec["links"].(int64) + 1
			}
		}
		return recs
	}
	b := newTestBackend(r, 100)
	_, err := b.Apply(ctx(), []graph.Doc{doc("a", 1, 1, []string{"b"}, nil), doc("b", 1, 3, []string{"a", "c"}, []string{"t"})})
	var fe *FenceError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFenceMismatch) {
		t.Fatalf("err = %v, want a *FenceError", err)
	}
	if fe.Key != "b" || fe.Have != (Counts{3, 3, 1}) || fe.Want != (Counts{3, 2, 1}) {
		t.Fatalf("fence error %+v, want b having 3 links against 2", fe)
	}
	for _, s := range []string{`"b"`, "3 HAS_CHUNK, 3 LINKS_TO, 1 TAGGED", "want 3, 2, 1"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
	var e *Error
	if !errors.As(err, &e) || e.Permanent() {
		t.Fatalf("a fence mismatch is permanent: %v", err)
	}
	if len(r.committed()) != 0 {
		t.Fatal("the mismatching transaction committed")
	}
}

// A stale version locks only its own node and writes nothing: not its
// fields, chunks or edges, not even the stubs of its links.
func TestApplyStaleWritesNothing(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 100)
	mustApply(t, b, doc("a", 2, 1, nil, nil))
	before := r.graph.clone()
	r.attempts = nil
	if got := mustApply(t, b, doc("a", 2, 3, []string{"x"}, nil)); got[0] {
		t.Fatal("version 2 again applied")
	}
	if got := mustApply(t, b, doc("a", 1, 3, []string{"x"}, nil)); got[0] {
		t.Fatal("version 1 after version 2 applied")
	}
	if len(r.attempts) != 2 {
		t.Fatalf("%d transactions, want 2", len(r.attempts))
	}
	for _, a := range r.attempts {
		if names(a.calls) != "readBatch writeDocuments" {
			t.Fatalf("a stale apply ran %s", names(a.calls))
		}
		if p := a.calls[1].params; fmt.Sprint(p["keys"], p["names"]) != "[a] []" {
			t.Fatalf("a stale apply locked %v and tags %v, want [a] and none", p["keys"], p["names"])
		}
	}
	if fmt.Sprint(r.graph.view("a")) != fmt.Sprint(before.view("a")) || len(r.graph.docs) != 1 {
		t.Fatalf("a stale apply changed the graph: %v, %d documents", r.graph.view("a"), len(r.graph.docs))
	}
}

func TestApplyInvalidDocsIsPermanentAndRunsNothing(t *testing.T) {
	r := newFakeRunner()
	_, err := newTestBackend(r, 100).Apply(ctx(), []graph.Doc{doc("a", 1, 0, nil, nil), doc("a", 2, 0, nil, nil)})
	var e *Error
	if !errors.As(err, &e) || !e.Permanent() || !errors.Is(err, ErrInvalidDocs) {
		t.Fatalf("err = %v, want a permanent ErrInvalidDocs", err)
	}
	if len(r.attempts) != 0 {
		t.Fatal("a transaction ran")
	}
}

func TestApplyNothing(t *testing.T) {
	r := newFakeRunner()
	applied, err := newTestBackend(r, 100).Apply(ctx(), nil)
	if err != nil || applied == nil || len(applied) != 0 || len(r.attempts) != 0 {
		t.Fatalf("Apply(nil) = %v, %v after %d attempts", applied, err, len(r.attempts))
	}
}

// ScanDocuments pages by key, BatchSize per read transaction, and sees
// every node once, stubs included.
func TestScanDocumentsPages(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 2)
	mustApply(t, b, doc("a", 1, 1, []string{"s1", "s2"}, nil), doc("b", 1, 1, nil, nil), doc("c", 1, 1, nil, nil))
	r.attempts = nil
	var keys []string
	stubs := 0
	if err := b.ScanDocuments(ctx(), func(v graph.View) error {
		keys = append(keys, v.Key)
		if v.Stub {
			stubs++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != "[a b c s1 s2]" || stubs != 2 {
		t.Fatalf("scanned %v with %d stubs, want [a b c s1 s2] with 2", keys, stubs)
	}
	var afters []string
	for _, a := range r.attempts {
		afters = append(afters, a.calls[0].params["after"].(string))
	}
	if fmt.Sprint(afters) != "[ b s1]" {
		t.Fatalf("pages after %q, want \"\", b, s1", afters)
	}
	stop := errors.New("stop")
	n := 0
	if err := b.ScanDocuments(ctx(), func(graph.View) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("fn's error: scan returned %v after %d calls", err, n)
	}
}

func TestDecodeView(t *testing.T) {
	id1, id0 := doc("a", 1, 2, nil, nil).Chunks[1].ID, doc("a", 1, 2, nil, nil).Chunks[0].ID
	v, err := decodeView(record{
		"key": "a", "version": int64(7), "deleted": false, "title": "T", "content_hash": "h", "stub": nil,
		"chunks": []any{
			map[string]any{"id": id1.String(), "ordinal": int64(1), "content_hash": "c1"},
			map[string]any{"id": id0.String(), "ordinal": int64(0), "content_hash": "c0"},
		},
		"links": []any{"z", "b"}, "tags": []any{}, "linked_by": []any{"y", "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := graph.View{Doc: graph.Doc{Key: "a", Version: 7, Title: "T", ContentHash: "h", Links: []string{"b", "z"},
		Chunks: []graph.Chunk{{ID: id0, Ordinal: 0, ContentHash: "c0"}, {ID: id1, Ordinal: 1, ContentHash: "c1"}}},
		LinkedBy: []string{"x", "y"}}
	if fmt.Sprintf("%+v", v) != fmt.Sprintf("%+v", want) {
		t.Fatalf("decodeView = %+v\nwant %+v", v, want)
	}
	stub, err := decodeView(record{"key": "s", "version": nil, "deleted": nil, "title": nil, "content_hash": nil,
		"stub": true, "chunks": []any{}, "links": []any{}, "tags": []any{}, "linked_by": []any{"a"}})
	if err != nil || !stub.Stub || stub.Version != 0 || fmt.Sprint(stub.LinkedBy) != "[a]" {
		t.Fatalf("stub = %+v, %v", stub, err)
	}
	for _, bad := range []record{
		{"key": nil},
		{"key": "a", "version": "7"},
		{"key": "a", "links": []any{int64(1)}},
		{"key": "a", "chunks": []any{map[string]any{"id": "not-a-uuid", "ordinal": int64(0)}}},
		{"key": "a", "chunks": []any{"chunk"}},
	} {
		if _, err := decodeView(bad); err == nil {
			t.Errorf("decodeView accepted %v", bad)
		}
	}
}

// Wipe deletes documents, chunks and tags in transactions of ten batches'
// worth of nodes until one deletes fewer, and the graph is then empty and
// takes the same documents again.
func TestWipe(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 1) // 10 nodes per wipe transaction
	var docs []graph.Doc
	for i := range 8 {
		key := fmt.Sprintf("k%d", i)
		docs = append(docs, doc(key, 1, 2, []string{"k0", "stub"}, []string{"t1", "t2"}))
	}
	mustApply(t, b, docs...)
	nodes := len(r.graph.docs) + len(r.graph.chunks) + len(r.graph.tags) // 8 docs + a stub, 16 chunks, 2 tags
	if nodes != 27 {
		t.Fatalf("graph before the wipe has %d nodes; want 27", nodes)
	}
	before := len(r.committed())
	deleted, err := b.Wipe(ctx())
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 27 {
		t.Errorf("Wipe reported %d nodes deleted; want 27", deleted)
	}
	if n := len(r.graph.docs) + len(r.graph.chunks) + len(r.graph.tags); n != 0 {
		t.Errorf("%d nodes left after the wipe", n)
	}
	// 48 relationships (16 HAS_CHUNK, 16 LINKS_TO, 16 TAGGED) first:
	// 10 + 10 + 10 + 10 + 8; then the 27 nodes: 10 + 10 + 7.
	if txs := len(r.committed()) - before; txs != 8 {
		t.Errorf("the wipe took %d transactions; want 8", txs)
	}
	var order []string
	for _, calls := range r.committed()[before:] {
		order = append(order, calls[0].name)
	}
	if want := "[wipeRelationships wipeRelationships wipeRelationships wipeRelationships wipeRelationships wipe wipe wipe]"; fmt.Sprint(order) != want {
		t.Errorf("the wipe ran %v; want the relationships before the nodes", order)
	}
	if applied := mustApply(t, b, docs[0]); !applied[0] {
		t.Error("a version the wiped graph held was not applied again")
	}
}

// A wipe that fails reports what it deleted before and the failure.
func TestWipeError(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 1)
	mustApply(t, b, doc("a", 1, 1, nil, nil))
	r.answer = func(name string, recs []record) []record {
		if name == "wipeRelationships" {
			return []record{{"deleted": "many"}}
		}
		return recs
	}
	if _, err := b.Wipe(ctx()); err == nil || !strings.Contains(err.Error(), "wipeRelationships returned deleted=string") {
		t.Fatalf("Wipe with a malformed answer: %v; want an error naming it", err)
	}
}

var memoryError = &neo4j.Neo4jError{Code: "Neo.TransientError.General.MemoryPoolOutOfMemoryError", Msg: "db.memory.transaction.max threshold reached"}

// A batch too large for the server's transaction memory is split in
// halves, each split again as needed, without the driver retrying the
// failed attempts; a single document too large fails permanently.
func TestApplySplitsBatchTooLarge(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 100)
	var guarded int // the size of the batch the running transaction writes
	r.fail = func(_, _ int, name string) error {
		if name == "writeDocuments" && guarded > 2 {
			return memoryError
		}
		return nil
	}
	var docs []graph.Doc
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		docs = append(docs, doc(k, 1, 1, nil, nil))
	}
	r.onRun = func(c call) {
		if c.name == "readBatch" {
			guarded = len(c.params["keys"].([]string))
		}
	}
	applied := mustApply(t, b, docs...)
	if !slices.Equal(applied, []bool{true, true, true, true, true}) {
		t.Fatalf("applied = %v", applied)
	}
	var got []string
	for _, a := range r.attempts {
		got = append(got, fmt.Sprint(guardKeys(a.calls), a.committed))
	}
	// [a b c d e] fails, then [a b] commits, [c d e] fails, [c] and [d e] commit.
	if want := "[[a b c d e] false [a b] true [c d e] false [c] true [d e] true]"; fmt.Sprint(got) != want {
		t.Fatalf("attempts %v\nwant %s", got, want)
	}

	r.fail = func(_, _ int, name string) error {
		if name == "writeDocuments" {
			return memoryError
		}
		return nil
	}
	r.attempts = nil
	_, err := b.Apply(ctx(), []graph.Doc{doc("z", 1, 1, nil, nil)})
	var e *Error
	if !errors.As(err, &e) || !e.Permanent() || !errors.Is(err, ErrTooLarge) || !errors.Is(err, memoryError) {
		t.Fatalf("err = %v, want a permanent ErrTooLarge keeping the server's error", err)
	}
	if len(r.attempts) != 1 {
		t.Fatalf("%d attempts of one document too large, want 1", len(r.attempts))
	}
}
