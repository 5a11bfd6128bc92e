//go:build linux

package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
)

// TestVerifyComparesWhatAReaderGets damages each thing a reader of a
// projection gets, behind its projector's back, while keeping what the
// writer declared (the chunk_hash payload, the content hash, the version):
// a point's text, a point's title, a point's tags and a point's vector in
// the index, a document's title in the graph. verify names exactly those
// documents, and a re-emission repairs every one of them.
func TestVerifyComparesWhatAReaderGets(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t)
	ix := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = ix.Close() })
	x, err := newIndex(ctx, ix)
	if err != nil {
		t.Fatal(err)
	}
	e, err := embed.NewHash(dim)
	if err != nil {
		t.Fatal(err)
	}
	gs := openGraph(t, t.TempDir())
	t.Cleanup(func() { _ = gs.Close() })
	g, err := graph.New(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	runProjector(t, p, x, "index")
	runProjector(t, p, g, "graph")
	p.write(t, 200, 40)
	check := func() []string {
		t.Helper()
		return verifyStores(t, p, ix, gs, verify.CheckVectors(e, 1))
	}
	agree := func(what string) {
		t.Helper()
		var last []string
		testenv.Eventually(t, what, 60*time.Second, func() bool {
			last = check()
			return len(last) == 0
		})
	}
	agree("both projections to agree with Postgres")

	rows, err := p.Pool.Query(ctx, `SELECT key FROM documents WHERE NOT deleted AND chunk_count >= 1 AND cardinality(tags) > 0 ORDER BY key LIMIT 5`)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 5 {
		t.Fatalf("found %d documents with chunks and tags, want 5", len(keys))
	}

	// The index: one point of each of four documents, rewritten with
	// everything the writer declared kept.
	damage := []func(*index.Point){
		func(pt *index.Point) { pt.Text += " (altered)" },
		func(pt *index.Point) { pt.Title = "another title" },
		func(pt *index.Point) { pt.Tags = append(slices.Clone(pt.Tags), "injected") },
		func(pt *index.Point) { slices.Reverse(pt.Vector) },
	}
	for i, harm := range damage {
		pts, err := ix.Points(ctx, keys[i], true)
		if err != nil || len(pts) == 0 {
			t.Fatalf("points of %s: %d, %v", keys[i], len(pts), err)
		}
		pt := pts[0]
		harm(&pt)
		if err := ix.Upsert(ctx, []index.Point{pt}); err != nil {
			t.Fatal(err)
		}
	}
	// The graph: a document's title.
	v, ok, err := gs.Document(ctx, keys[4])
	if err != nil || !ok {
		t.Fatalf("graph document %s: %v %v", keys[4], ok, err)
	}
	retitled := v.Doc
	retitled.Title, retitled.Repair = "another title", true
	if applied, err := gs.Apply(ctx, []graph.Doc{retitled}); err != nil || !applied[0] {
		t.Fatalf("damaging %s in the graph: %v %v", keys[4], applied, err)
	}

	var want []string
	for _, k := range keys[:4] {
		want = append(want, "index "+verify.StaleChunks+" "+k)
	}
	want = append(want, "graph "+verify.ContentMismatch+" "+keys[4])
	slices.Sort(want)
	if got := check(); !slices.Equal(got, want) {
		t.Fatalf("verify after the damage: %v\nwant %v", got, want)
	}

	got, err := p.store.Reemit(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Reemitted) != len(keys) {
		t.Fatalf("re-emitted %+v", got)
	}
	agree("the re-emissions to repair every damaged document")
}
