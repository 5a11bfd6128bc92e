package embedded

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

func TestPackKeepsEveryField(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a0, a1, a2 := mkPoint("a", 1, 0, randVec(r, 4)), mkPoint("a", 1, 1, randVec(r, 4)), mkPoint("a", 1, 2, randVec(r, 4))
	a1.Title, a1.ContentHash, a1.Tags = "another title", "another hash", nil // a point unlike its document's first
	// Its own tags follow the first point's in the same slice.
	a2.Tags = []string{"own"}
	b0 := mkPoint("b", 3, 0, randVec(r, 4))
	b0.Tags = nil
	c0, c1 := mkPoint("c", 2, 0, randVec(r, 4)), mkPoint("c", 2, 1, nil)
	c0.Tags, c0.Text, c0.ChunkHash = []string{}, "", ""
	c1.Tags = []string{"x", "ü", ""}
	a3 := mkPoint("a", 2, 0, randVec(r, 4)) // the key again, after others: a group of its own
	in := []index.Point{a0, a1, a2, b0, c0, c1, a3}
	want := make([]index.Point, len(in))
	ptrs := make([]*index.Point, len(in))
	for i := range in {
		want[i] = in[i]
		want[i].Tags = slices.Clone(in[i].Tags)
		want[i].Vector = slices.Clone(in[i].Vector)
		ptrs[i] = &in[i]
	}
	got, err := pack(ptrs, false)
	must(t, err)
	// The copies own their memory: changing the input changes nothing.
	for i := range in {
		if len(in[i].Vector) > 0 {
			in[i].Vector[0] = 42
		}
		if len(in[i].Tags) > 0 {
			in[i].Tags[0] = "changed"
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d points packed, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(*got[i], want[i]) {
			t.Errorf("point %d:\n got %#v\nwant %#v", i, *got[i], want[i])
		}
	}
	// A slice shared within a document cannot be appended into another's.
	_ = append(got[0].Tags, "appended")
	_ = append(got[0].Vector, 7)
	if !reflect.DeepEqual(got[1].Tags, want[1].Tags) || !reflect.DeepEqual(*got[2], want[2]) || !reflect.DeepEqual(got[1].Vector, want[1].Vector) {
		t.Errorf("an append to one point's tags or vector changed another's: %v %v %v", got[1].Tags, got[2].Tags, got[1].Vector)
	}
}

func TestPackNormalisesOnWrite(t *testing.T) {
	p := mkPoint("k", 1, 0, []float32{3, 4})
	z := mkPoint("k", 1, 1, []float32{0, float32(negZero())})
	got, err := pack([]*index.Point{&p, &z}, true)
	must(t, err)
	if !slices.Equal(got[0].Vector, []float32{0.6, 0.8}) || !slices.Equal(got[1].Vector, []float32{0, 0}) || math.Signbit(float64(got[1].Vector[1])) {
		t.Errorf("vectors %v %v, want [0.6 0.8] and zeros", got[0].Vector, got[1].Vector)
	}
	bad := mkPoint("k", 1, 2, []float32{1, float32(nan())})
	if _, err := pack([]*index.Point{&p, &bad}, true); err == nil {
		t.Error("a NaN component was packed")
	}
}

// TestPackAllocatesPerDocument: a document's points take the same number
// of allocations whatever their number, which is what keeps the garbage
// collector's work per document small.
func TestPackAllocatesPerDocument(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	allocs := func(chunks int) float64 {
		points := docPoints(r, "doc", 1, chunks, 16)
		ptrs := make([]*index.Point, len(points))
		for i := range points {
			ptrs[i] = &points[i]
		}
		return testing.AllocsPerRun(20, func() {
			if _, err := pack(ptrs, false); err != nil {
				t.Fatal(err)
			}
		})
	}
	few, many := allocs(3), allocs(60)
	if few != many || few > 10 {
		t.Errorf("packing a document of 3 chunks took %v allocations, of 60 chunks %v: want the same, at most 10", few, many)
	}
}

// BenchmarkHeldPoints measures what the garbage collector spends on
// points kept in memory: 30,000 documents of 3 chunks of dimension 256,
// held as decoded (each field its own allocation) and as the store holds
// them, in the same run; see waltest.BenchmarkHeld.
func BenchmarkHeldPoints(b *testing.B) {
	const docs, chunks, dim = 30_000, 3, 256
	r := rand.New(rand.NewPCG(9, 10))
	waltest.BenchmarkHeld(b, "point", docs*chunks, Open, func(b *testing.B, s *Store, inStore bool) any {
		var held []index.Point
		if inStore {
			must(b, s.Ensure(b.Context(), dim))
		}
		for d := range docs {
			points := docPoints(r, fmt.Sprint("doc-", d), 1, chunks, dim)
			if inStore {
				must(b, s.Upsert(b.Context(), points))
			} else {
				held = append(held, points...)
			}
		}
		return held
	})
}

func negZero() float64 { return math.Copysign(0, -1) }
func nan() float64     { return math.NaN() }

// TestMapsHoldTheStoredStrings: the store's maps hold, as keys, strings
// of the points and markers stored now, never of replaced ones (whose
// packed text they would keep alive) nor the caller's; and a document's
// points stay packed together: after writes, after a reopen and after a
// compaction.
func TestMapsHoldTheStoredStrings(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := open(t, dir, Options{})
	must(t, s.Ensure(ctx, 4))
	r := rand.New(rand.NewPCG(11, 12))
	// New versions of documents of different sizes: removing the old
	// points moves others into their places, so a document's points end
	// up scattered over the store's list of all points.
	for v := int64(1); v <= 3; v++ {
		for i := range 20 {
			key := fmt.Sprint("doc-", i)
			must(t, s.Upsert(ctx, docPoints(r, key, v, 1+(i+int(v))%4, 4)))
			must(t, s.DeleteStale(ctx, []index.Keep{{Key: key, Version: v}}))
			must(t, s.SetMarkers(ctx, []index.Marker{{Key: key, Version: v, ContentHash: fmt.Sprint("hash-", key, v)}}))
		}
	}
	checkHeldStrings(t, s, "after writes")
	must(t, s.Close())
	s = open(t, dir, Options{})
	checkHeldStrings(t, s, "after a reopen")
	must(t, s.Compact(ctx))
	must(t, s.Close())
	s = open(t, dir, Options{})
	checkHeldStrings(t, s, "after a compaction and a reopen")
}

func checkHeldStrings(t *testing.T, s *Store, when string) {
	t.Helper()
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.byKey) == 0 || len(s.markers) == 0 {
		t.Fatalf("%s: nothing stored", when)
	}
	for k, ps := range s.byKey {
		if !slices.ContainsFunc(ps, func(p *index.Point) bool { return same(k, p.Key) }) {
			t.Errorf("%s: the points of %q are keyed by a string none of them holds", when, k)
		}
		// A document's points are packed together: one key string.
		if !slices.ContainsFunc(ps, func(p *index.Point) bool { return !same(ps[0].Key, p.Key) }) {
			continue
		}
		t.Errorf("%s: the points of %q are packed in more than one group", when, k)
	}
	for k, m := range s.markers {
		if !same(k, m.Key) {
			t.Errorf("%s: the marker of %q is keyed by a string other than its own", when, k)
		}
	}
}
