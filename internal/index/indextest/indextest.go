// Package indextest is the conformance suite every index backend passes:
// the embedded index, the Qdrant adapter against the in-process gRPC
// server, and the Qdrant adapter against a real Qdrant when one is
// configured. It checks every method of an index.Backend (its Writer,
// Reader and MarkerScanner roles, and Close) and, through an index.Index
// over its ReadWriter side, the projection's semantics: upsert, idempotent
// re-upsert, stale versions skipped, shrinkage, withdrawal without
// resurrection, repairs of the held version, counts and search.
package indextest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Dim is the vector dimension the suite uses.
const Dim = 64

// Run runs the suite; newBackend returns a fresh, empty backend for each
// subtest (closed by the suite).
func Run(t *testing.T, newBackend func(t *testing.T) index.Backend) {
	t.Helper()
	open := func(t *testing.T) index.Backend {
		b := newBackend(t)
		t.Cleanup(func() { _ = b.Close() })
		if err := b.Ensure(context.Background(), Dim); err != nil {
			t.Fatalf("Ensure(%d): %v", Dim, err)
		}
		return b
	}
	t.Run("EnsureIsIdempotentAndChecksDimension", func(t *testing.T) {
		b := open(t)
		if err := b.Ensure(context.Background(), Dim); err != nil {
			t.Fatalf("second Ensure: %v", err)
		}
		err := b.Ensure(context.Background(), Dim+1)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprint(Dim)) || !strings.Contains(err.Error(), fmt.Sprint(Dim+1)) {
			t.Fatalf("Ensure with another dimension: %v; want an error naming %d and %d", err, Dim, Dim+1)
		}
	})
	t.Run("MarkersNeverGoBack", func(t *testing.T) { testMarkers(t, open(t)) })
	t.Run("UpsertReplacesByID", func(t *testing.T) { testUpsert(t, open(t)) })
	t.Run("DeleteStaleRemovesOnlyOlderVersions", func(t *testing.T) { testDeleteStale(t, open(t)) })
	t.Run("SearchRanksByCosine", func(t *testing.T) { testSearch(t, open(t)) })
	t.Run("Projection", func(t *testing.T) { testProjection(t, open(t)) })
	t.Run("WithdrawalDoesNotResurrect", func(t *testing.T) { testWithdrawal(t, open(t)) })
	t.Run("SearchThroughTheIndex", func(t *testing.T) { testIndexSearch(t, open(t)) })
	t.Run("RepairRewritesTheHeldVersion", func(t *testing.T) { testRepair(t, open(t)) })
	t.Run("StaleWriterChangesNothing", func(t *testing.T) { testStaleWriter(t, open(t)) })
	t.Run("EmbedderIsRecorded", func(t *testing.T) {
		b := newBackend(t)
		t.Cleanup(func() { _ = b.Close() })
		testEmbedderRecord(t, b)
	})
	t.Run("IndexAdoptsAStoreWithoutAnEmbedder", func(t *testing.T) { testEmbedderAdopted(t, open(t)) })
	t.Run("IndexRefusesAnotherEmbedder", func(t *testing.T) {
		b := newBackend(t)
		t.Cleanup(func() { _ = b.Close() })
		testEmbedderMismatch(t, b)
	})
}

// testEmbedderRecord: none before anything is recorded (before Ensure
// too), the last one recorded after, and the record is no point of any
// document: searches, counts and marker scans never see it.
func testEmbedderRecord(t *testing.T, b index.Backend) {
	if id, ok, err := b.Embedder(ctx()); err != nil || ok {
		t.Fatalf("Embedder of a new store: %+v, %v, %v; want none", id, ok, err)
	}
	must(t, b.Ensure(ctx(), Dim))
	if id, ok, err := b.Embedder(ctx()); err != nil || ok {
		t.Fatalf("Embedder after Ensure: %+v, %v, %v; want none", id, ok, err)
	}
	a := embed.Identity{Kind: embed.KindHTTP, Model: "model-a", Dimension: Dim}
	must(t, b.RecordEmbedder(ctx(), a))
	if id, ok, err := b.Embedder(ctx()); err != nil || !ok || id != a {
		t.Fatalf("Embedder: %+v, %v, %v; want %+v", id, ok, err, a)
	}
	h := embed.Identity{Kind: embed.KindHash, Model: fmt.Sprintf("%s/%d", embed.HashVersion, Dim), Dimension: Dim}
	must(t, b.RecordEmbedder(ctx(), h))
	if id, ok, err := b.Embedder(ctx()); err != nil || !ok || id != h {
		t.Fatalf("Embedder after a second record: %+v, %v, %v; want %+v", id, ok, err, h)
	}
	if err := b.RecordEmbedder(ctx(), embed.Identity{Kind: embed.KindHash}); err == nil {
		t.Fatal("RecordEmbedder of an incomplete identity: no error")
	}
	// The record is no document's: a search along the axis of the
	// record's fixed vector finds the one chunk, counts and markers are
	// the document's alone.
	must(t, b.Upsert(ctx(), []index.Point{point("k", 1, 0, unit(1))}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k", Version: 1, ContentHash: "hash-k-1"}}))
	hits, err := b.Search(ctx(), unit(0), 10)
	must(t, err)
	if len(hits) != 1 || hits[0].Point.Key != "k" {
		t.Fatalf("search: %+v; want the one chunk of k", hits)
	}
	counts, err := b.Counts(ctx(), []string{"k", ""})
	must(t, err)
	if counts["k"] != 1 || counts[""] != 0 {
		t.Fatalf("counts %v; want k: 1", counts)
	}
	var markers []index.Marker
	must(t, b.ScanMarkers(ctx(), func(m index.Marker) error { markers = append(markers, m); return nil }))
	if len(markers) != 1 || markers[0].Key != "k" {
		t.Fatalf("markers scanned: %+v; want k's alone", markers)
	}
}

// testEmbedderAdopted: a store made before embedders were recorded (points
// and markers, no record) is taken to hold the configured embedder's
// vectors: the index records it and writes.
func testEmbedderAdopted(t *testing.T, b index.Backend) {
	must(t, b.Upsert(ctx(), []index.Point{point("old", 1, 0, unit(1))}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "old", Version: 1, ContentHash: "hash-old-1"}}))
	x := newIndex(t, b)
	stored, configured, refusing := x.Embedder()
	if refusing != nil || stored != configured {
		t.Fatalf("Embedder() over a store without a record: %+v, %+v, %v; want the configured one adopted", stored, configured, refusing)
	}
	if id, ok, err := b.Embedder(ctx()); err != nil || !ok || id != configured {
		t.Fatalf("recorded: %+v, %v, %v; want %+v", id, ok, err, configured)
	}
	if got := apply(t, x, event("new", 1, body(1, "words"))); got[0] != projector.Applied {
		t.Fatalf("apply after adoption: %v", got)
	}
}

// otherModel is a model of its own with the hash embedder's vectors
// reversed, of the same dimension.
type otherModel struct{ *embed.Hash }

func (otherModel) Kind() string { return "test" }
func (otherModel) Name() string { return "reversed-hash" }

func (m otherModel) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	vecs, err := m.Hash.Embed(ctx, texts)
	for _, v := range vecs {
		slices.Reverse(v)
	}
	return vecs, err
}

// testEmbedderMismatch: an index made with one embedder records it; one
// opened on the same store with another refuses every write (a transient
// error that says to rebuild, so the projector holds the events), writes
// nothing, and answers searches only with an embedder for the stored
// vectors.
func testEmbedderMismatch(t *testing.T, b index.Backend) {
	x := newIndex(t, b) // the hash embedder of Dim dimensions
	stored, configured, refusing := x.Embedder()
	if refusing != nil || stored != configured || stored.Kind != embed.KindHash || stored.Dimension != Dim {
		t.Fatalf("Embedder() of a new index: %+v, %+v, %v", stored, configured, refusing)
	}
	if id, ok, err := b.Embedder(ctx()); err != nil || !ok || id != stored {
		t.Fatalf("recorded: %+v, %v, %v; want %+v", id, ok, err, stored)
	}
	ev := event("doc", 1, body(3, "cats"))
	if got := apply(t, x, ev); got[0] != projector.Applied {
		t.Fatalf("apply: %v", got)
	}
	before, err := b.Counts(ctx(), []string{"doc"})
	must(t, err)
	want, err := x.Search(ctx(), "cats", 3)
	must(t, err)

	// The same embedder again: no refusal.
	if again := newIndex(t, b); func() error { _, _, r := again.Embedder(); return r }() != nil {
		t.Fatal("an index with the recorded embedder refuses writes")
	}

	// Another model of the same dimension: only the recorded identity
	// tells its vectors apart.
	h, err := embed.NewHash(Dim)
	must(t, err)
	other := otherModel{h}
	y, err := index.New(ctx(), b, other, index.Options{})
	must(t, err)
	stored2, configured2, refusing := y.Embedder()
	var mismatch *index.EmbedderMismatchError
	if !errors.As(refusing, &mismatch) || stored2 != stored || configured2 != embed.IdentityOf(other) {
		t.Fatalf("Embedder() with another embedder: %+v, %+v, %v; want a mismatch of %+v", stored2, configured2, refusing, stored)
	}
	if !strings.Contains(refusing.Error(), "converge rebuild index") || !strings.Contains(refusing.Error(), other.Name()) || !strings.Contains(refusing.Error(), stored.Model) {
		t.Fatalf("the refusal %q does not name both embedders and the rebuild", refusing)
	}
	res := y.Apply(ctx(), []*contract.Event{event("doc", 2, body(2, "dogs")), event("new", 1, "a new document")})
	for i, r := range res {
		if !errors.As(r.Err, &mismatch) || projector.IsPermanent(r.Err) {
			t.Fatalf("result %d of a write with another embedder: %+v; want the transient mismatch", i, r)
		}
	}
	markers, err := b.Markers(ctx(), []string{"doc", "new"})
	must(t, err)
	after, err := b.Counts(ctx(), []string{"doc", "new"})
	must(t, err)
	if len(markers) != 1 || markers["doc"].Version != 1 || after["doc"] != before["doc"] || after["new"] != 0 {
		t.Fatalf("after refused writes: markers %+v, counts %v; want doc at version 1 with %d points alone", markers, after, before["doc"])
	}
	if id, _, _ := b.Embedder(ctx()); id != stored {
		t.Fatalf("the recorded embedder changed to %+v", id)
	}
	if _, err := y.Search(ctx(), "cats", 3); err == nil || !errors.As(err, &mismatch) {
		t.Fatalf("search without an embedder for the stored vectors: %v; want it refused, naming the mismatch", err)
	}
	z, err := index.New(ctx(), b, other, index.Options{ReadEmbedder: func(id embed.Identity) (embed.Embedder, error) {
		return embed.ForIdentity(embed.Config{}, id)
	}})
	must(t, err)
	got, err := z.Search(ctx(), "cats", 3)
	must(t, err)
	if len(got) == 0 || len(got) != len(want) || got[0].Point.ID != want[0].Point.ID {
		t.Fatalf("search with the stored vectors' embedder: %+v; want %+v", got, want)
	}
}

func ctx() context.Context { return context.Background() }

// unit is a unit vector along axis i.
func unit(i int) []float32 {
	v := make([]float32, Dim)
	v[i%Dim] = 1
	return v
}

func point(key string, version int64, ordinal int, vec []float32) index.Point {
	text := fmt.Sprintf("%s v%d chunk %d", key, version, ordinal)
	return index.Point{ID: contract.ChunkID(key, version, ordinal), Key: key, Version: version, Ordinal: ordinal,
		ContentHash: fmt.Sprintf("hash-%s-%d", key, version), ChunkHash: contract.TextHash(text),
		Title: "title of " + key, Tags: []string{"a", "b"}, Text: text, Vector: vec}
}

func testMarkers(t *testing.T, b index.Backend) {
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k1", Version: 5, ContentHash: "h5"}, {Key: "k2", Version: 1, Deleted: true, ContentHash: "d1"}}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k1", Version: 3, ContentHash: "h3"}}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k1", Version: 5, ContentHash: "other"}}))
	got, err := b.Markers(ctx(), []string{"k1", "k2", "missing"})
	must(t, err)
	if m := got["k1"]; m.Version != 5 || m.ContentHash != "h5" || m.Deleted {
		t.Fatalf("k1 marker %+v after writing versions 5, 3 and 5 again; want version 5, h5", m)
	}
	if m := got["k2"]; m.Version != 1 || !m.Deleted {
		t.Fatalf("k2 marker %+v; want version 1, deleted", m)
	}
	if _, ok := got["missing"]; ok {
		t.Fatal("a key never written has a marker")
	}
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k1", Version: 7, ContentHash: "h7"}}))
	got, err = b.Markers(ctx(), []string{"k1"})
	must(t, err)
	if got["k1"].Version != 7 {
		t.Fatalf("k1 marker %+v after writing version 7", got["k1"])
	}
	var scanned []string
	must(t, b.ScanMarkers(ctx(), func(m index.Marker) error { scanned = append(scanned, m.Key); return nil }))
	slices.Sort(scanned)
	if !slices.Equal(scanned, []string{"k1", "k2"}) {
		t.Fatalf("ScanMarkers saw %v, want [k1 k2]", scanned)
	}
	// Markers are not points.
	counts, err := b.Counts(ctx(), []string{"k1", "k2"})
	must(t, err)
	if counts["k1"] != 0 || counts["k2"] != 0 {
		t.Fatalf("counts %v: markers were counted as points", counts)
	}
}

func testUpsert(t *testing.T, b index.Backend) {
	p := point("doc", 1, 0, unit(1))
	must(t, b.Upsert(ctx(), []index.Point{p, point("doc", 1, 1, unit(2))}))
	must(t, b.Upsert(ctx(), []index.Point{p})) // idempotent
	p.Text, p.Vector = "replaced", unit(3)
	must(t, b.Upsert(ctx(), []index.Point{p}))
	pts, err := b.Points(ctx(), "doc", true)
	must(t, err)
	if len(pts) != 2 {
		t.Fatalf("%d points, want 2", len(pts))
	}
	if pts[0].ID != p.ID || pts[0].Text != "replaced" || !near(pts[0].Vector, unit(3)) {
		t.Fatalf("point 0 = %+v, want the replaced one", pts[0])
	}
	want := point("doc", 1, 1, nil)
	got := pts[1]
	got.Vector = nil
	if got.ID != want.ID || got.Key != want.Key || got.Version != 1 || got.Ordinal != 1 || got.ContentHash != want.ContentHash ||
		got.ChunkHash != want.ChunkHash || got.Title != want.Title || !slices.Equal(got.Tags, want.Tags) || got.Text != want.Text {
		t.Fatalf("point 1 read back as %+v, want %+v", got, want)
	}
	noVec, err := b.Points(ctx(), "doc", false)
	must(t, err)
	if len(noVec) != 2 || noVec[0].Vector != nil {
		t.Fatalf("Points without vectors returned %d points, first vector %v", len(noVec), noVec[0].Vector)
	}
	// Many points in one call (backends batch them).
	var many []index.Point
	for i := range 1000 {
		many = append(many, point("big", 2, i, unit(i)))
	}
	must(t, b.Upsert(ctx(), many))
	counts, err := b.Counts(ctx(), []string{"doc", "big", "none"})
	must(t, err)
	if counts["doc"] != 2 || counts["big"] != 1000 || counts["none"] != 0 {
		t.Fatalf("counts %v, want doc 2, big 1000, none 0", counts)
	}
}

// testDeleteStale checks that DeleteStale removes only older versions (a
// writer that resumes late with an older version must not delete a newer
// one's points), exactly beyond 2^53, and that Retract removes one
// version.
func testDeleteStale(t *testing.T, b index.Backend) {
	const big = int64(1) << 53 // 2^53 and 2^53+1 are one float64
	var pts []index.Point
	for v := int64(1); v <= 3; v++ {
		for o := range 3 {
			pts = append(pts, point("a", v, o, unit(o)), point("b", v, o, unit(o)), point("c", v, o, unit(o)))
		}
		pts = append(pts, point("big", big+v-1, 0, unit(0)))
	}
	must(t, b.Upsert(ctx(), pts))
	must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "a", Version: 2}, {Key: "b", Version: 0}, {Key: "c", Version: 3}, {Key: "big", Version: big + 1}}))
	versions := func(key string) []int64 {
		got, err := b.Points(ctx(), key, false)
		must(t, err)
		var out []int64
		for _, p := range got {
			out = append(out, p.Version)
		}
		return out
	}
	for key, want := range map[string][]int64{
		"a":   {2, 2, 2, 3, 3, 3},
		"b":   nil,
		"c":   {3, 3, 3},
		"big": {big + 1, big + 2},
	} {
		if got := versions(key); !slices.Equal(got, want) {
			t.Fatalf("after DeleteStale, %s holds versions %v; want %v", key, got, want)
		}
	}
	must(t, b.Retract(ctx(), []index.Keep{{Key: "a", Version: 3}, {Key: "big", Version: big + 2}, {Key: "none", Version: 1}}))
	if got := versions("a"); !slices.Equal(got, []int64{2, 2, 2}) {
		t.Fatalf("after Retract of version 3, a holds versions %v; want 2, 2, 2", got)
	}
	if got := versions("big"); !slices.Equal(got, []int64{big + 1}) {
		t.Fatalf("after Retract of version 2^53+2, big holds versions %v; want 2^53+1", got)
	}
	counts, err := b.Counts(ctx(), []string{"a", "b", "c"})
	must(t, err)
	if counts["a"] != 3 || counts["b"] != 0 || counts["c"] != 3 {
		t.Fatalf("counts %v, want a 3, b 0, c 3", counts)
	}
}

func testSearch(t *testing.T, b index.Backend) {
	q := unit(0)
	near := make([]float32, Dim)
	near[0], near[1] = 0.9, 0.1
	mid := make([]float32, Dim)
	mid[0], mid[1] = 0.5, 0.5
	must(t, b.Upsert(ctx(), []index.Point{point("far", 1, 0, unit(5)), point("mid", 1, 0, mid), point("near", 1, 0, near), point("exact", 1, 0, q)}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "exact", Version: 1}})) // markers never show up in results
	hits, err := b.Search(ctx(), q, 3)
	must(t, err)
	var keys []string
	for _, h := range hits {
		keys = append(keys, h.Point.Key)
		if h.Point.Vector != nil {
			t.Fatal("search hits carry vectors")
		}
	}
	if !slices.Equal(keys, []string{"exact", "near", "mid"}) {
		t.Fatalf("search order %v, want [exact near mid]", keys)
	}
	if math.Abs(float64(hits[0].Score)-1) > 1e-4 || hits[0].Score < hits[1].Score || hits[1].Score < hits[2].Score {
		t.Fatalf("scores %v, %v, %v: want 1 then decreasing", hits[0].Score, hits[1].Score, hits[2].Score)
	}
	if hits[0].Point.Text != "exact v1 chunk 0" || hits[0].Point.Title != "title of exact" {
		t.Fatalf("hit payload %+v", hits[0].Point)
	}
}

// event builds the upserted event of key at version with body split by the
// production chunker into small chunks (so that bodies make several).
func event(key string, version int64, body string, tags ...string) *contract.Event {
	d, err := contract.Document{Key: key, Version: version, Title: "T " + key, Body: body, Tags: tags}.Normalize()
	if err != nil {
		panic(err)
	}
	cfg := chunking.DefaultConfig()
	cfg.TargetBytes, cfg.MaxBytes = 32, 64
	ev := contract.NewUpsertedEvent(d, chunking.Split(d.Body, cfg))
	return &ev
}

func withdrawn(key string, version int64) *contract.Event {
	ev := contract.NewWithdrawnEvent(key, version)
	return &ev
}

func body(paragraphs int, word string) string {
	var b strings.Builder
	for i := range paragraphs {
		fmt.Fprintf(&b, "Paragraph %d about %s and more %s words here.\n\n", i, word, word)
	}
	return b.String()
}

func newIndex(t *testing.T, b index.ReadWriter) *index.Index {
	e, err := embed.NewHash(Dim)
	must(t, err)
	x, err := index.New(ctx(), b, e, index.Options{ReuseVectors: true})
	must(t, err)
	return x
}

func apply(t *testing.T, x *index.Index, events ...*contract.Event) []projector.Outcome {
	t.Helper()
	return applyIn(t, ctx(), x, events...)
}

// repair applies events as repairs (re-emitted events).
func repair(t *testing.T, x *index.Index, events ...*contract.Event) []projector.Outcome {
	t.Helper()
	return applyIn(t, projector.WithRepair(ctx()), x, events...)
}

func applyIn(t *testing.T, ctx context.Context, x *index.Index, events ...*contract.Event) []projector.Outcome {
	t.Helper()
	results := x.Apply(ctx, events)
	if len(results) != len(events) {
		t.Fatalf("%d results for %d events", len(results), len(events))
	}
	out := make([]projector.Outcome, len(events))
	for i, ev := range events {
		if err := results[i].Err; err != nil {
			t.Fatalf("apply %s v%d: %v", ev.Key, ev.Version, err)
		}
		out[i] = results[i].Outcome
	}
	return out
}

// expect checks that the backend holds exactly the points of ev (ids,
// versions, ordinals, hashes) and its marker.
func expect(t *testing.T, b index.Backend, ev *contract.Event) {
	t.Helper()
	pts, err := b.Points(ctx(), ev.Key, false)
	must(t, err)
	want := 0
	if ev.Kind == contract.KindUpserted {
		want = len(ev.Chunks)
	}
	if len(pts) != want {
		t.Fatalf("%s: %d points, want %d (version %d)", ev.Key, len(pts), want, ev.Version)
	}
	for i, p := range pts {
		c := ev.Chunks[i]
		if p.ID != c.ID || p.Version != ev.Version || p.Ordinal != c.Ordinal || p.ChunkHash != c.Hash || p.ContentHash != ev.ContentHash || p.Text != c.Text {
			t.Fatalf("%s point %d = %+v, want chunk %+v of version %d", ev.Key, i, p, c, ev.Version)
		}
	}
	ms, err := b.Markers(ctx(), []string{ev.Key})
	must(t, err)
	m := ms[ev.Key]
	if m.Version != ev.Version || m.Deleted != (ev.Kind == contract.KindWithdrawn) || m.ContentHash != ev.ContentHash {
		t.Fatalf("%s marker %+v, want version %d deleted %v hash %s", ev.Key, m, ev.Version, ev.Kind == contract.KindWithdrawn, ev.ContentHash)
	}
}

func testProjection(t *testing.T, b index.Backend) {
	x := newIndex(t, b)
	v1 := event("doc", 1, body(6, "alpha"), "x")
	v2 := event("doc", 2, body(6, "alpha")+"A new closing paragraph.\n", "x", "y") // shares its first chunks with v1
	v3 := event("doc", 3, body(2, "beta"))                                         // fewer chunks
	if len(v3.Chunks) >= len(v2.Chunks) || len(v1.Chunks) < 3 {
		t.Fatalf("bodies chunk into %d, %d, %d: the test needs shrinkage", len(v1.Chunks), len(v2.Chunks), len(v3.Chunks))
	}
	other := event("other", 1, body(3, "gamma"))

	if got := apply(t, x, v1, other); !slices.Equal(got, []projector.Outcome{projector.Applied, projector.Applied}) {
		t.Fatalf("first apply: %v", got)
	}
	expect(t, b, v1)
	expect(t, b, other)
	if got := apply(t, x, v1); got[0] != projector.Skipped {
		t.Fatalf("re-applying v1: %v, want skipped", got)
	}
	expect(t, b, v1)
	apply(t, x, v2)
	expect(t, b, v2)
	if got := apply(t, x, v1); got[0] != projector.Skipped {
		t.Fatalf("v1 after v2: %v, want skipped", got)
	}
	expect(t, b, v2)
	apply(t, x, v3)
	expect(t, b, v3) // shrinkage: no stale points of v2 left
	apply(t, x, v2, other)
	expect(t, b, v3)
	expect(t, b, other)
}

func testWithdrawal(t *testing.T, b index.Backend) {
	x := newIndex(t, b)
	v1 := event("doc", 1, body(4, "delta"))
	apply(t, x, v1)
	w2 := withdrawn("doc", 2)
	apply(t, x, w2)
	expect(t, b, w2)
	for _, late := range []*contract.Event{v1, event("doc", 2, body(1, "late"))} {
		if got := apply(t, x, late); got[0] != projector.Skipped {
			t.Fatalf("late upsert v%d after the withdrawal: %v, want skipped", late.Version, got)
		}
		expect(t, b, w2)
	}
	// A newer version brings it back, as in Postgres.
	v3 := event("doc", 3, body(2, "epsilon"))
	apply(t, x, v3)
	expect(t, b, v3)
	// Withdrawing a document never seen leaves a tombstone that stops its
	// older versions.
	apply(t, x, withdrawn("ghost", 5))
	if got := apply(t, x, event("ghost", 4, "boo")); got[0] != projector.Skipped {
		t.Fatalf("ghost v4 after its withdrawal at v5: %v", got)
	}
	expect(t, b, withdrawn("ghost", 5))
}

// testRepair damages a document behind the projection's back (its points
// deleted): re-applying its event normally skips it, as the marker holds
// its version, and leaves it damaged; applying it as a repair makes it
// equal to the original again. A repair never brings back an older
// version, and a repaired withdrawal removes stray points.
func testRepair(t *testing.T, b index.Backend) {
	x := newIndex(t, b)
	v1 := event("doc", 1, body(5, "zeta"), "x")
	other := event("other", 1, body(2, "eta"))
	apply(t, x, v1, other)
	expect(t, b, v1)

	must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "doc"}}))
	if got := apply(t, x, v1); got[0] != projector.Skipped {
		t.Fatalf("re-applying v1 normally: %v, want skipped", got)
	}
	counts, err := b.Counts(ctx(), []string{"doc"})
	must(t, err)
	if counts["doc"] != 0 {
		t.Fatalf("a skipped event wrote %d points", counts["doc"])
	}
	if got := repair(t, x, v1, other); !slices.Equal(got, []projector.Outcome{projector.Applied, projector.Applied}) {
		t.Fatalf("repairing v1 and other: %v, want applied", got)
	}
	expect(t, b, v1)
	expect(t, b, other)

	v2 := event("doc", 2, body(3, "theta"))
	apply(t, x, v2)
	if got := repair(t, x, v1); got[0] != projector.Skipped {
		t.Fatalf("a repair of v1 after v2: %v, want skipped", got)
	}
	expect(t, b, v2)

	w3 := withdrawn("doc", 3)
	apply(t, x, w3)
	must(t, b.Upsert(ctx(), []index.Point{point("doc", 3, 0, unit(1))})) // a stray point
	if got := apply(t, x, w3); got[0] != projector.Skipped {
		t.Fatalf("re-applying the withdrawal normally: %v, want skipped", got)
	}
	repair(t, x, w3)
	expect(t, b, w3)
}

func testIndexSearch(t *testing.T, b index.Backend) {
	x := newIndex(t, b)
	apply(t, x, event("cats", 1, "Cats purr and sleep in the sun all day long."),
		event("rockets", 1, "Rockets burn fuel to reach orbit around the earth."),
		event("bread", 1, "Bread needs flour, water, salt and yeast to rise."))
	hits, err := x.Search(ctx(), "which rockets reach orbit", 2)
	must(t, err)
	if len(hits) == 0 || hits[0].Point.Key != "rockets" {
		t.Fatalf("search for rockets: %+v", hits)
	}
	if len(hits) != 2 {
		t.Fatalf("k=2 returned %d hits", len(hits))
	}
}

func near(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-5 {
			return false
		}
	}
	return true
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
