// Package graphtest is the conformance suite every graph backend passes:
// the embedded graph, and Neo4j when a server is configured. It checks the
// semantics of graph.Backend: upsert, idempotent re-apply, stale versions
// skipped, chunk shrinkage, link and tag replacement, stubs filled in,
// withdrawal without resurrection (incoming links kept), repairs of the
// held version, scans and counts.
package graphtest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Run runs the suite; newBackend returns a fresh, empty backend for each
// subtest (closed by the suite).
func Run(t *testing.T, newBackend func(t *testing.T) graph.Backend) {
	t.Helper()
	open := func(t *testing.T) graph.Backend {
		b := newBackend(t)
		t.Cleanup(func() { _ = b.Close() })
		if err := b.Ensure(ctx()); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
		if err := b.Ensure(ctx()); err != nil {
			t.Fatalf("second Ensure: %v", err)
		}
		return b
	}
	t.Run("UpsertAndRead", func(t *testing.T) { testUpsert(t, open(t)) })
	t.Run("ReapplyAndStaleChangeNothing", func(t *testing.T) { testStale(t, open(t)) })
	t.Run("ChunksShrink", func(t *testing.T) { testShrink(t, open(t)) })
	t.Run("LinksAndTagsAreReplaced", func(t *testing.T) { testReplace(t, open(t)) })
	t.Run("StubsAreFilledIn", func(t *testing.T) { testStubs(t, open(t)) })
	t.Run("WithdrawalKeepsATombstone", func(t *testing.T) { testWithdrawal(t, open(t)) })
	t.Run("LargeBatchAndScan", func(t *testing.T) { testLargeBatch(t, open(t)) })
	t.Run("ThroughTheProjection", func(t *testing.T) { testProjection(t, open(t)) })
	t.Run("RepairRewritesTheHeldVersion", func(t *testing.T) { testRepair(t, open(t)) })
}

func ctx() context.Context { return context.Background() }

// Upsert returns document key at version with n chunks, links and tags.
func Upsert(key string, version int64, chunks int, links, tags []string) graph.Doc {
	d := graph.Doc{Key: key, Version: version, Title: fmt.Sprintf("%s v%d", key, version),
		ContentHash: fmt.Sprintf("hash-%s-%d", key, version), Links: sortedCopy(links), Tags: sortedCopy(tags)}
	for i := range chunks {
		d.Chunks = append(d.Chunks, graph.Chunk{ID: contract.ChunkID(key, version, i), Ordinal: i,
			ContentHash: contract.TextHash(fmt.Sprintf("%s %d %d", key, version, i))})
	}
	return d
}

// Withdrawal returns the tombstone of key at version.
func Withdrawal(key string, version int64) graph.Doc {
	return graph.Doc{Key: key, Version: version, Deleted: true, ContentHash: contract.WithdrawnHash(key)}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

func apply(t *testing.T, b graph.Backend, docs ...graph.Doc) []bool {
	t.Helper()
	applied, err := b.Apply(ctx(), docs)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if len(applied) != len(docs) {
		t.Fatalf("Apply returned %d flags for %d documents", len(applied), len(docs))
	}
	return applied
}

func read(t *testing.T, b graph.Backend, key string) graph.View {
	t.Helper()
	v, ok, err := b.Document(ctx(), key)
	if err != nil {
		t.Fatalf("Document(%s): %v", key, err)
	}
	if !ok {
		t.Fatalf("Document(%s): no node", key)
	}
	return v
}

// Expect checks that the graph holds exactly d for d.Key (not a stub), and
// that its incoming links are linkedBy.
func Expect(t *testing.T, b graph.Backend, d graph.Doc, linkedBy ...string) {
	t.Helper()
	v := read(t, b, d.Key)
	if v.Stub {
		t.Fatalf("%s is a stub, want version %d", d.Key, d.Version)
	}
	if v.Version != d.Version || v.Deleted != d.Deleted || v.Title != d.Title || v.ContentHash != d.ContentHash {
		t.Fatalf("%s node = {v%d deleted %v %q %s}, want {v%d deleted %v %q %s}", d.Key, v.Version, v.Deleted, v.Title, v.ContentHash,
			d.Version, d.Deleted, d.Title, d.ContentHash)
	}
	if !slices.Equal(nonNil(v.Links), nonNil(d.Links)) || !slices.Equal(nonNil(v.Tags), nonNil(d.Tags)) {
		t.Fatalf("%s links %v tags %v, want links %v tags %v", d.Key, v.Links, v.Tags, d.Links, d.Tags)
	}
	if len(v.Chunks) != len(d.Chunks) {
		t.Fatalf("%s has %d chunks, want %d", d.Key, len(v.Chunks), len(d.Chunks))
	}
	for i, c := range v.Chunks {
		if c != d.Chunks[i] {
			t.Fatalf("%s chunk %d = %+v, want %+v", d.Key, i, c, d.Chunks[i])
		}
	}
	want := sortedCopy(linkedBy)
	if !slices.Equal(nonNil(v.LinkedBy), nonNil(want)) {
		t.Fatalf("%s linked by %v, want %v", d.Key, v.LinkedBy, want)
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func testUpsert(t *testing.T, b graph.Backend) {
	a := Upsert("a", 1, 3, []string{"c", "b"}, []string{"y", "x"})
	if got := apply(t, b, a); !got[0] {
		t.Fatal("a new document was not applied")
	}
	Expect(t, b, a)
	for _, stub := range []string{"b", "c"} {
		v := read(t, b, stub)
		if !v.Stub || v.Version != 0 || !slices.Equal(v.LinkedBy, []string{"a"}) || len(v.Chunks) != 0 {
			t.Fatalf("stub %s = %+v", stub, v)
		}
	}
	if _, ok, err := b.Document(ctx(), "nobody"); err != nil || ok {
		t.Fatalf("Document(nobody) = %v, %v; want no node", ok, err)
	}
}

func testStale(t *testing.T, b graph.Backend) {
	v2 := Upsert("doc", 2, 2, []string{"x"}, []string{"t"})
	apply(t, b, v2)
	if got := apply(t, b, v2); got[0] {
		t.Fatal("re-applying version 2 reported applied")
	}
	v1 := Upsert("doc", 1, 5, []string{"other"}, []string{"old"})
	if got := apply(t, b, v1); got[0] {
		t.Fatal("version 1 after version 2 reported applied")
	}
	Expect(t, b, v2)
	if _, ok, _ := b.Document(ctx(), "other"); ok {
		t.Fatal("the skipped version's link created a stub")
	}
}

func testShrink(t *testing.T, b graph.Backend) {
	apply(t, b, Upsert("doc", 1, 6, nil, nil))
	v2 := Upsert("doc", 2, 2, nil, nil)
	apply(t, b, v2)
	Expect(t, b, v2)
	v3 := Upsert("doc", 3, 4, nil, nil)
	apply(t, b, v3)
	Expect(t, b, v3)
}

func testReplace(t *testing.T, b graph.Backend) {
	apply(t, b, Upsert("a", 1, 1, []string{"b", "c"}, []string{"t1", "t2"}))
	a2 := Upsert("a", 2, 1, []string{"c", "d"}, []string{"t2", "t3"})
	apply(t, b, a2)
	Expect(t, b, a2)
	if v := read(t, b, "b"); len(v.LinkedBy) != 0 {
		t.Fatalf("b still linked by %v after a's links were replaced", v.LinkedBy)
	}
	for _, k := range []string{"c", "d"} {
		if v := read(t, b, k); !slices.Equal(v.LinkedBy, []string{"a"}) {
			t.Fatalf("%s linked by %v, want [a]", k, v.LinkedBy)
		}
	}
	// Links among documents written in one batch, both ways.
	x, y := Upsert("x", 1, 1, []string{"y"}, nil), Upsert("y", 1, 1, []string{"x"}, nil)
	apply(t, b, x, y)
	Expect(t, b, x, "y")
	Expect(t, b, y, "x")
}

func testStubs(t *testing.T, b graph.Backend) {
	apply(t, b, Upsert("a", 1, 1, []string{"b"}, nil))
	b1 := Upsert("b", 1, 2, []string{"a"}, []string{"t"})
	if got := apply(t, b, b1); !got[0] {
		t.Fatal("the first upsert of a stub's key was not applied")
	}
	Expect(t, b, b1, "a")
	Expect(t, b, Upsert("a", 1, 1, []string{"b"}, nil), "b")
}

func testWithdrawal(t *testing.T, b graph.Backend) {
	apply(t, b, Upsert("a", 1, 3, []string{"b"}, []string{"t"}), Upsert("x", 1, 1, []string{"a"}, nil))
	w := Withdrawal("a", 2)
	if got := apply(t, b, w); !got[0] {
		t.Fatal("the withdrawal was not applied")
	}
	Expect(t, b, w, "x") // incoming links stay
	if v := read(t, b, "b"); len(v.LinkedBy) != 0 {
		t.Fatalf("b still linked by %v after a was withdrawn", v.LinkedBy)
	}
	for _, late := range []graph.Doc{Upsert("a", 1, 3, []string{"b"}, []string{"t"}), Upsert("a", 2, 1, nil, nil)} {
		if got := apply(t, b, late); got[0] {
			t.Fatalf("a late upsert v%d after the withdrawal at v2 was applied", late.Version)
		}
		Expect(t, b, w, "x")
	}
	a3 := Upsert("a", 3, 1, nil, []string{"back"})
	apply(t, b, a3)
	Expect(t, b, a3, "x")
	// A withdrawal of a key never seen leaves a tombstone.
	apply(t, b, Withdrawal("ghost", 5))
	if got := apply(t, b, Upsert("ghost", 4, 1, nil, nil)); got[0] {
		t.Fatal("ghost v4 after its withdrawal at v5 was applied")
	}
	Expect(t, b, Withdrawal("ghost", 5))
}

func testLargeBatch(t *testing.T, b graph.Backend) {
	const n = 250
	var docs []graph.Doc
	for i := range n {
		docs = append(docs, Upsert(fmt.Sprintf("d%03d", i), 1, 1+i%4,
			[]string{fmt.Sprintf("d%03d", (i+1)%n), fmt.Sprintf("d%03d", (i+7)%n)}, []string{fmt.Sprint("tag", i%5)}))
	}
	for i, ok := range apply(t, b, docs...) {
		if !ok {
			t.Fatalf("document %d of the batch not applied", i)
		}
	}
	for i := 0; i < n; i += 37 {
		Expect(t, b, docs[i], fmt.Sprintf("d%03d", (i-1+n)%n), fmt.Sprintf("d%03d", (i-7+n)%n))
	}
	seen := map[string]bool{}
	if err := b.ScanDocuments(ctx(), func(v graph.View) error {
		if seen[v.Key] {
			return fmt.Errorf("%s scanned twice", v.Key)
		}
		seen[v.Key] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("scan saw %d documents, want %d", len(seen), n)
	}
}

func testProjection(t *testing.T, b graph.Backend) {
	p, err := graph.New(ctx(), b)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(key string, version int64, body string, links ...string) *contract.Event {
		d, err := contract.Document{Key: key, Version: version, Title: "T", Body: body, Links: links, Tags: []string{"z"}}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		ev := contract.NewUpsertedEvent(d, []string{body})
		return &ev
	}
	v2 := mk("p", 2, "second", "q")
	res := p.Apply(ctx(), []*contract.Event{v2, mk("q", 1, "q body")})
	for _, r := range res {
		if r.Err != nil || r.Outcome != projector.Applied {
			t.Fatalf("apply: %+v", res)
		}
	}
	if res := p.Apply(ctx(), []*contract.Event{mk("p", 1, "first")}); res[0].Err != nil || res[0].Outcome != projector.Skipped {
		t.Fatalf("stale event: %+v", res)
	}
	w := contract.NewWithdrawnEvent("q", 2)
	if res := p.Apply(ctx(), []*contract.Event{&w}); res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("withdrawal: %+v", res)
	}
	Expect(t, b, graph.FromEvent(v2))
	Expect(t, b, graph.FromEvent(&w), "p")
}

// testRepair damages a document behind the projection's back (the same
// version applied as a repair with fewer chunks, other links, tags and
// content): re-applying the original normally skips it and leaves the
// damage; applying it as a repair makes the document equal to the original
// again, edges and incoming links included. A repair never brings back an
// older version. Through the projection, a call marked with
// projector.WithRepair is a repair.
func testRepair(t *testing.T, b graph.Backend) {
	orig := Upsert("doc", 2, 4, []string{"x", "y"}, []string{"t1", "t2"})
	x := Upsert("x", 1, 1, nil, nil)
	apply(t, b, orig, x)
	Expect(t, b, orig)

	damaged := Upsert("doc", 2, 1, []string{"z"}, []string{"t3"})
	damaged.Title, damaged.ContentHash, damaged.Repair = "damaged", "damaged-hash", true
	if got := apply(t, b, damaged); !got[0] {
		t.Fatal("a repair of the version the graph holds was not applied")
	}
	Expect(t, b, damaged)
	if got := apply(t, b, orig); got[0] {
		t.Fatal("re-applying the held version normally was applied")
	}
	Expect(t, b, damaged)

	repair := orig
	repair.Repair = true
	if got := apply(t, b, repair); !got[0] {
		t.Fatal("the repair was not applied")
	}
	Expect(t, b, orig)
	Expect(t, b, x, "doc")
	if v := read(t, b, "z"); !v.Stub || len(v.LinkedBy) != 0 {
		t.Fatalf("z after the repair: stub %v linked by %v, want a stub no one links to", v.Stub, v.LinkedBy)
	}
	if v := read(t, b, "y"); !slices.Equal(v.LinkedBy, []string{"doc"}) {
		t.Fatalf("y linked by %v, want [doc]", v.LinkedBy)
	}

	v3 := Upsert("doc", 3, 2, nil, nil)
	apply(t, b, v3)
	if got := apply(t, b, repair); got[0] {
		t.Fatal("a repair of version 2 after version 3 was applied")
	}
	Expect(t, b, v3)

	p, err := graph.New(ctx(), b)
	if err != nil {
		t.Fatal(err)
	}
	d, err := contract.Document{Key: "doc", Version: 3, Title: "T", Body: "the body", Tags: []string{"z"}}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	ev := contract.NewUpsertedEvent(d, []string{d.Body})
	res := p.Apply(ctx(), []*contract.Event{&ev})
	if res[0].Err != nil || res[0].Outcome != projector.Skipped {
		t.Fatalf("the held version through the projection: %+v, want skipped", res)
	}
	res = p.Apply(projector.WithRepair(ctx()), []*contract.Event{&ev})
	if res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("the held version as a repair through the projection: %+v, want applied", res)
	}
	Expect(t, b, graph.FromEvent(&ev))
}
