package embedded

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

var testNamespace = uuid.MustParse("6f0f3c2e-5a7b-4d8e-9c1a-2b3c4d5e6f70")

func pointID(key string, version int64, ordinal int) uuid.UUID {
	return uuid.NewSHA1(testNamespace, fmt.Appendf(nil, "%s/%d/%d", key, version, ordinal))
}

func mkPoint(key string, version int64, ordinal int, vec []float32) index.Point {
	return index.Point{
		ID:          pointID(key, version, ordinal),
		Key:         key,
		Version:     version,
		Ordinal:     ordinal,
		ContentHash: "content-" + key + "-" + strconv.FormatInt(version, 10),
		ChunkHash:   fmt.Sprintf("chunk-%d", ordinal),
		Title:       "Title of " + key,
		Tags:        []string{"t1", key},
		Text:        fmt.Sprintf("text %d of %s v%d", ordinal, key, version),
		Vector:      vec,
	}
}

func randVec(r *rand.Rand, dim int) []float32 {
	v := make([]float32, dim)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

func docPoints(r *rand.Rand, key string, version int64, n, dim int) []index.Point {
	ps := make([]index.Point, n)
	for i := range ps {
		ps[i] = mkPoint(key, version, i, randVec(r, dim))
	}
	return ps
}

func open(t testing.TB, dir string, opts Options) *Store { return waltest.Open(t, Open, dir, opts) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// state is everything a store holds, for comparing stores.
type state struct {
	Dim     int
	Points  map[string][]index.Point
	Markers map[string]index.Marker
}

func dump(t testing.TB, s *Store) state {
	t.Helper()
	ctx := context.Background()
	st := state{Points: map[string][]index.Point{}, Markers: map[string]index.Marker{}}
	s.mu.RLock()
	st.Dim = s.dim
	keys := make([]string, 0, len(s.byKey))
	for k := range s.byKey {
		keys = append(keys, k)
	}
	s.mu.RUnlock()
	for _, k := range keys {
		ps, err := s.Points(ctx, k, true)
		must(t, err)
		st.Points[k] = ps
	}
	must(t, s.ScanMarkers(ctx, func(m index.Marker) error {
		st.Markers[m.Key] = m
		return nil
	}))
	return st
}

func sameState(t testing.TB, got, want state) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("state differs:\n got  dim %d, %d keys, %d markers\n want dim %d, %d keys, %d markers",
			got.Dim, len(got.Points), len(got.Markers), want.Dim, len(want.Points), len(want.Markers))
	}
}

// populate writes a mix of every kind of record.
func populate(t testing.TB, s *Store, r *rand.Rand, dim int) {
	t.Helper()
	ctx := context.Background()
	must(t, s.Ensure(ctx, dim))
	for d := range 5 {
		key := fmt.Sprintf("doc-%d", d)
		for v := int64(1); v <= 3; v++ {
			must(t, s.Upsert(ctx, docPoints(r, key, v, 3+d, dim)))
			must(t, s.SetMarkers(ctx, []index.Marker{{Key: key, Version: v, ContentHash: fmt.Sprint("h", v)}}))
		}
		must(t, s.DeleteStale(ctx, []index.Keep{{Key: key, Version: 3}}))
	}
	must(t, s.DeleteStale(ctx, []index.Keep{{Key: "doc-4", Version: 0}}))
	must(t, s.SetMarkers(ctx, []index.Marker{{Key: "doc-4", Version: 4, Deleted: true}}))
	// nil and empty tags must both survive.
	p := mkPoint("tags", 1, 0, randVec(r, dim))
	p.Tags = nil
	q := mkPoint("tags", 1, 1, randVec(r, dim))
	q.Tags = []string{}
	must(t, s.Upsert(ctx, []index.Point{p, q}))
}

func TestPersistenceAcrossReopen(t *testing.T) {
	for _, opts := range []Options{{}, {SyncEvery: 5 * time.Millisecond}, {CompactBytes: 2048}} {
		t.Run(fmt.Sprintf("%+v", opts), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, opts)
			populate(t, s, rand.New(rand.NewPCG(1, 1)), 16)
			want := dump(t, s)
			if len(want.Points) != 5 || len(want.Points["doc-0"]) != 3 || want.Markers["doc-4"].Version != 4 {
				t.Fatalf("unexpected state before reopen: %d keys, doc-0 %d points", len(want.Points), len(want.Points["doc-0"]))
			}
			if tags := want.Points["tags"]; tags[0].Tags != nil || tags[1].Tags == nil {
				t.Fatalf("tags: got %#v and %#v", tags[0].Tags, tags[1].Tags)
			}
			must(t, s.Close())

			s2 := open(t, dir, opts)
			sameState(t, dump(t, s2), want)
			// And once more after further writes to the reopened log.
			must(t, s2.SetMarkers(context.Background(), []index.Marker{{Key: "new", Version: 1}}))
			want = dump(t, s2)
			must(t, s2.Close())
			sameState(t, dump(t, open(t, dir, opts)), want)
		})
	}
}

func TestStoredVectorsAreNormalised(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.Ensure(ctx, 2))
	must(t, s.Upsert(ctx, []index.Point{mkPoint("k", 1, 0, []float32{3, 4})}))
	ps, err := s.Points(ctx, "k", true)
	must(t, err)
	if got := ps[0].Vector; math.Abs(float64(got[0])-0.6) > 1e-6 || math.Abs(float64(got[1])-0.8) > 1e-6 {
		t.Fatalf("vector %v, want [0.6 0.8]", got)
	}
	ps, err = s.Points(ctx, "k", false)
	must(t, err)
	if ps[0].Vector != nil {
		t.Fatalf("vector returned without withVectors")
	}
	bad := mkPoint("k", 1, 1, []float32{float32(math.NaN()), 1})
	if err := s.Upsert(ctx, []index.Point{bad}); err == nil {
		t.Fatal("NaN vector accepted")
	}
}

func TestUpsertDeleteStaleCountsPoints(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.Ensure(ctx, 2))
	v := []float32{1, 0}
	// Written out of order; Points sorts by version then ordinal.
	must(t, s.Upsert(ctx, []index.Point{mkPoint("a", 2, 1, v), mkPoint("a", 1, 1, v), mkPoint("a", 2, 0, v), mkPoint("a", 1, 0, v), mkPoint("b", 1, 0, v)}))
	ps, err := s.Points(ctx, "a", false)
	must(t, err)
	var order []string
	for _, p := range ps {
		order = append(order, fmt.Sprintf("%d/%d", p.Version, p.Ordinal))
	}
	if got, want := strings.Join(order, " "), "1/0 1/1 2/0 2/1"; got != want {
		t.Fatalf("Points order %q, want %q", got, want)
	}
	// Replacing by ID changes the payload, not the count.
	p := mkPoint("a", 2, 0, v)
	p.Text = "replaced"
	must(t, s.Upsert(ctx, []index.Point{p}))
	counts, err := s.Counts(ctx, []string{"a", "b", "none"})
	must(t, err)
	if want := map[string]int{"a": 4, "b": 1, "none": 0}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("Counts %v, want %v", counts, want)
	}
	must(t, s.DeleteStale(ctx, []index.Keep{{Key: "a", Version: 2}, {Key: "b", Version: 0}, {Key: "none", Version: 3}}))
	ps, err = s.Points(ctx, "a", false)
	must(t, err)
	if len(ps) != 2 || ps[0].Version != 2 || ps[0].Text != "replaced" {
		t.Fatalf("after DeleteStale: %+v", ps)
	}
	counts, err = s.Counts(ctx, []string{"a", "b"})
	must(t, err)
	if want := map[string]int{"a": 2, "b": 0}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("Counts %v, want %v", counts, want)
	}
	// An ID moved to another key leaves the old key.
	moved := mkPoint("c", 1, 0, v)
	moved.ID = pointID("a", 2, 1)
	must(t, s.Upsert(ctx, []index.Point{moved}))
	counts, err = s.Counts(ctx, []string{"a", "c"})
	must(t, err)
	if want := map[string]int{"a": 1, "c": 1}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("Counts after move %v, want %v", counts, want)
	}
}

func TestDimension(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, Options{})
	if err := s.Upsert(ctx, []index.Point{mkPoint("k", 1, 0, []float32{1, 2, 3, 4})}); !errors.Is(err, ErrNoDimension) {
		t.Fatalf("Upsert before Ensure: %v, want ErrNoDimension", err)
	}
	must(t, s.Ensure(ctx, 4))
	must(t, s.Ensure(ctx, 4))
	check := func(err error) {
		t.Helper()
		if !errors.Is(err, ErrDimensionMismatch) || !strings.Contains(err.Error(), "4") || !strings.Contains(err.Error(), "8") {
			t.Fatalf("got %v, want a dimension mismatch naming 4 and 8", err)
		}
	}
	check(s.Ensure(ctx, 8))
	check(s.Upsert(ctx, []index.Point{mkPoint("k", 1, 0, make([]float32, 8))}))
	must(t, s.Upsert(ctx, []index.Point{mkPoint("k", 1, 0, []float32{1, 2, 3, 4})}))
	_, err := s.Search(ctx, make([]float32, 8), 1)
	check(err)
	must(t, s.Close())

	s = open(t, dir, Options{})
	check(s.Ensure(ctx, 8))
	must(t, s.Ensure(ctx, 4))
	if err := s.Ensure(ctx, 0); err == nil {
		t.Fatal("Ensure(0) accepted")
	}
}

func TestMarkerGuard(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, Options{})
	m := func(key string, v int64, deleted bool, hash string) index.Marker {
		return index.Marker{Key: key, Version: v, Deleted: deleted, ContentHash: hash}
	}
	steps := []struct {
		set  []index.Marker
		want index.Marker
	}{
		{[]index.Marker{m("k", 5, false, "a")}, m("k", 5, false, "a")},
		{[]index.Marker{m("k", 3, false, "old")}, m("k", 5, false, "a")},  // older: ignored
		{[]index.Marker{m("k", 5, true, "other")}, m("k", 5, false, "a")}, // same version: ignored
		{[]index.Marker{m("k", 6, true, "")}, m("k", 6, true, "")},        // newer withdrawal
		{[]index.Marker{m("k", 5, false, "b")}, m("k", 6, true, "")},      // no resurrection
		// Within one call the guard applies in order.
		{[]index.Marker{m("k", 8, false, "c"), m("k", 7, false, "d")}, m("k", 8, false, "c")},
		{[]index.Marker{m("k", 9, false, "e"), m("k", 10, false, "f")}, m("k", 10, false, "f")},
	}
	for i, st := range steps {
		must(t, s.SetMarkers(ctx, st.set))
		got, err := s.Markers(ctx, []string{"k", "absent"})
		must(t, err)
		if want := map[string]index.Marker{"k": st.want}; !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: %v, want %v", i, got, want)
		}
	}
	must(t, s.Close())
	s = open(t, dir, Options{})
	got, err := s.Markers(ctx, []string{"k"})
	must(t, err)
	if got["k"] != m("k", 10, false, "f") {
		t.Fatalf("after reopen: %v", got)
	}
}

func TestSearchRanking(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.Ensure(ctx, 3))
	at := func(key string, deg float64, z float32) index.Point {
		rad := deg * math.Pi / 180
		// Scaled: only the direction counts.
		return mkPoint(key, 1, 0, []float32{7 * float32(math.Cos(rad)), 7 * float32(math.Sin(rad)), z})
	}
	tieA, tieB := at("tie-a", 60, 0), at("tie-b", 60, 0)
	must(t, s.Upsert(ctx, []index.Point{
		at("p90", 90, 0), at("p10", 10, 0), at("p45", 45, 0), tieA, at("p180", 180, 0), at("p0", 0, 0), tieB,
	}))
	hits, err := s.Search(ctx, []float32{2, 0, 0}, 5)
	must(t, err)
	first, second := "tie-a", "tie-b"
	if compareIDs(tieB.ID, tieA.ID) < 0 {
		first, second = second, first
	}
	want := []string{"p0", "p10", "p45", first, second}
	wantScores := []float64{1, math.Cos(10 * math.Pi / 180), math.Cos(math.Pi / 4), 0.5, 0.5}
	if len(hits) != len(want) {
		t.Fatalf("%d hits, want %d", len(hits), len(want))
	}
	for i, h := range hits {
		if h.Point.Key != want[i] || math.Abs(float64(h.Score)-wantScores[i]) > 1e-5 {
			t.Errorf("hit %d: %s %.6f, want %s %.6f", i, h.Point.Key, h.Score, want[i], wantScores[i])
		}
		if h.Point.Vector != nil {
			t.Errorf("hit %d has a vector", i)
		}
		if h.Point.Text == "" || len(h.Point.Tags) != 2 {
			t.Errorf("hit %d lacks its payload: %+v", i, h.Point)
		}
	}
	all, err := s.Search(ctx, []float32{1, 0, 0}, 100)
	must(t, err)
	if len(all) != 7 || all[6].Point.Key != "p180" || math.Abs(float64(all[6].Score)+1) > 1e-5 {
		t.Fatalf("k beyond the size: %d hits, last %+v", len(all), all[len(all)-1])
	}
	if hits, err := s.Search(ctx, []float32{1, 0, 0}, 0); err != nil || hits != nil {
		t.Fatalf("k=0: %v %v", hits, err)
	}
}

// TestSearchMatchesReference checks the sharded scan against a full sort,
// with many ties.
func TestSearchMatchesReference(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{CompactBytes: -1})
	const dim = 8
	must(t, s.Ensure(ctx, dim))
	r := rand.New(rand.NewPCG(7, 7))
	var ps []index.Point
	for i := range 3*searchShard + 17 {
		// Few distinct directions, so scores tie often.
		v := make([]float32, dim)
		v[r.IntN(dim)] = 1
		v[r.IntN(dim)] = float32(r.IntN(3))
		ps = append(ps, mkPoint(fmt.Sprint("k", i%97), int64(i), 0, v))
	}
	for batch := range slices.Chunk(ps, 4096) {
		must(t, s.Upsert(ctx, batch))
	}
	for range 5 {
		q := randVec(r, dim)
		got, err := s.Search(ctx, q, 25)
		must(t, err)
		qn, _ := normalize(q)
		type ref struct {
			id    uuid.UUID
			score float32
		}
		var refs []ref
		s.mu.RLock()
		for _, p := range s.all {
			refs = append(refs, ref{p.ID, dot(qn, p.Vector)})
		}
		s.mu.RUnlock()
		slices.SortFunc(refs, func(a, b ref) int {
			if a.score != b.score {
				if a.score > b.score {
					return -1
				}
				return 1
			}
			return compareIDs(a.id, b.id)
		})
		for i := range got {
			if got[i].Point.ID != refs[i].id || got[i].Score != refs[i].score {
				t.Fatalf("hit %d: %s %v, want %s %v", i, got[i].Point.ID, got[i].Score, refs[i].id, refs[i].score)
			}
		}
	}
}

func TestTornTailRecovered(t *testing.T) {
	const dim = 8
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, start, end int64) // the last record is [start, end)
		keepB  bool                                              // the last record survives
	}{
		{"partial header", truncateAt(5), false},
		{"header only", truncateAt(wal.HeaderSize), false},
		{"partial payload", truncateAt(wal.HeaderSize + 40), false},
		{"one byte short", func(t *testing.T, path string, start, end int64) { truncateAt(end-start-1)(t, path, start, end) }, false},
		{"payload not written", func(t *testing.T, path string, start, end int64) {
			flip(t, path, end-3)
		}, false},
		{"record zero-filled", func(t *testing.T, path string, start, end int64) {
			writeAt(t, path, start, make([]byte, end-start))
		}, false},
		{"zeros after the last record", func(t *testing.T, path string, start, end int64) {
			writeAt(t, path, end, make([]byte, 4096))
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			r := rand.New(rand.NewPCG(3, 3))
			s := open(t, dir, Options{})
			must(t, s.Ensure(ctx, dim))
			must(t, s.Upsert(ctx, docPoints(r, "a", 1, 4, dim)))
			wantA := dump(t, s)
			path := filepath.Join(dir, wal.LogName(1))
			start := fileSize(t, path)
			must(t, s.Upsert(ctx, docPoints(r, "b", 1, 4, dim)))
			wantAB := dump(t, s)
			end := fileSize(t, path)
			must(t, s.Close())

			tc.damage(t, path, start, end)
			s = open(t, dir, Options{})
			want, size := wantA, start
			if tc.keepB {
				want, size = wantAB, end
			}
			sameState(t, dump(t, s), want)
			if got := fileSize(t, path); got != size {
				t.Fatalf("log is %d bytes after recovery, want %d", got, size)
			}
			// The recovered log takes new records and reads back cleanly.
			must(t, s.Upsert(ctx, docPoints(r, "c", 1, 2, dim)))
			want = dump(t, s)
			must(t, s.Close())
			sameState(t, dump(t, open(t, dir, Options{})), want)
		})
	}
}

func TestTornLogHeaderRecovered(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	must(t, s.Close())
	path := filepath.Join(dir, wal.LogName(1))
	must(t, os.Truncate(path, 3))
	s = open(t, dir, Options{})
	must(t, s.Ensure(context.Background(), 4))
	must(t, s.Close())
	s = open(t, dir, Options{})
	if s.dim != 4 {
		t.Fatalf("dim %d after reopen", s.dim)
	}
}

func TestCorruptionDetected(t *testing.T) {
	const dim = 8
	// setup writes records a, b and c and returns the log and a's offset.
	setup := func(t *testing.T) (dir, path string, aStart, aEnd int64) {
		ctx := context.Background()
		dir = t.TempDir()
		r := rand.New(rand.NewPCG(5, 5))
		s := open(t, dir, Options{})
		must(t, s.Ensure(ctx, dim))
		path = filepath.Join(dir, wal.LogName(1))
		aStart = fileSize(t, path)
		must(t, s.Upsert(ctx, docPoints(r, "a", 1, 4, dim)))
		aEnd = fileSize(t, path)
		must(t, s.Upsert(ctx, docPoints(r, "b", 1, 4, dim)))
		must(t, s.SetMarkers(ctx, []index.Marker{{Key: "b", Version: 1}}))
		must(t, s.Close())
		return dir, path, aStart, aEnd
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, aStart, aEnd int64)
		reason string
	}{
		{"payload bit", func(t *testing.T, path string, aStart, aEnd int64) { flip(t, path, aStart+wal.HeaderSize+30) }, "payload checksum"},
		{"length bit", func(t *testing.T, path string, aStart, aEnd int64) { flip(t, path, aStart+1) }, "length checksum"},
		{"checksum bit", func(t *testing.T, path string, aStart, aEnd int64) { flip(t, path, aStart+9) }, "payload checksum"},
		{"zeroed record", func(t *testing.T, path string, aStart, aEnd int64) {
			writeAt(t, path, aStart, make([]byte, aEnd-aStart))
		}, "length checksum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, path, aStart, aEnd := setup(t)
			tc.damage(t, path, aStart, aEnd)
			_, err := Open(dir, Options{})
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("Open: %v, want a *CorruptError", err)
			}
			if ce.Path != path || ce.Offset != aStart || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("got %v, want %s at offset %d: %s", err, path, aStart, tc.reason)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), strconv.FormatInt(aStart, 10)) {
				t.Fatalf("message %q does not name the file and offset", err)
			}
		})
	}

	t.Run("torn record in an earlier log", func(t *testing.T) {
		dir, path, aStart, _ := setup(t)
		s := open(t, dir, Options{CompactBytes: -1})
		must(t, s.rotateOnly())
		must(t, s.Close())
		must(t, os.Truncate(path, aStart+20))
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want corruption", err)
		}
	})
	t.Run("missing log", func(t *testing.T) {
		dir, _, _, _ := setup(t)
		s := open(t, dir, Options{CompactBytes: -1})
		must(t, s.rotateOnly())
		must(t, s.rotateOnly())
		must(t, s.Close())
		must(t, os.Remove(filepath.Join(dir, wal.LogName(2))))
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), wal.LogName(2)) {
			t.Fatalf("Open: %v, want an error naming %s", err, wal.LogName(2))
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		dir, _, _, _ := setup(t)
		s := open(t, dir, Options{})
		must(t, s.Compact(context.Background()))
		must(t, s.Close())
		snap := filepath.Join(dir, wal.SnapshotName)
		flip(t, snap, fileSize(t, snap)/2)
		_, err := Open(dir, Options{})
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Path != snap {
			t.Fatalf("Open: %v, want corruption in %s", err, snap)
		}
	})
	t.Run("short snapshot", func(t *testing.T) {
		dir, _, _, _ := setup(t)
		s := open(t, dir, Options{})
		must(t, s.Compact(context.Background()))
		must(t, s.Close())
		snap := filepath.Join(dir, wal.SnapshotName)
		must(t, os.Truncate(snap, fileSize(t, snap)-1))
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want corruption", err)
		}
	})
}

// rotateOnly starts a new log without writing a snapshot.
func (s *Store) rotateOnly() error {
	return s.log.Rotate()
}

func TestSecondOpenerLocked(t *testing.T) {
	dir := t.TempDir()
	waltest.ExpectLocked(t, Open, dir, open(t, dir, Options{}))
}

func TestCompaction(t *testing.T) {
	ctx := context.Background()
	const dim = 16
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(9, 9))
	s := open(t, dir, Options{CompactBytes: 32 << 10})
	must(t, s.Ensure(ctx, dim))
	for v := int64(1); v <= 30; v++ {
		for d := range 10 {
			key := fmt.Sprint("doc-", d)
			must(t, s.Upsert(ctx, docPoints(r, key, v, 5, dim)))
			must(t, s.DeleteStale(ctx, []index.Keep{{Key: key, Version: v}}))
			must(t, s.SetMarkers(ctx, []index.Marker{{Key: key, Version: v}}))
		}
	}
	// Background compactions ran: the log was rotated.
	if s.log.Seq() == 1 {
		t.Fatal("no automatic compaction ran")
	}
	must(t, s.Compact(ctx))
	want := dump(t, s)
	must(t, s.Close())
	logs, err := wal.ListLogs(dir)
	must(t, err)
	if len(logs) != 1 {
		t.Fatalf("%d logs after compaction, want 1", len(logs))
	}
	if _, err := os.Stat(filepath.Join(dir, wal.SnapshotName)); err != nil {
		t.Fatal(err)
	}
	sameState(t, dump(t, open(t, dir, Options{})), want)
}

// TestCompactionCrashLeftovers puts back what a crash during compaction can
// leave: logs the snapshot covers and an unfinished temporary snapshot.
func TestCompactionCrashLeftovers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, Options{})
	populate(t, s, rand.New(rand.NewPCG(2, 2)), 8)
	must(t, s.Close())
	old, err := os.ReadFile(filepath.Join(dir, wal.LogName(1)))
	must(t, err)

	s = open(t, dir, Options{})
	must(t, s.Compact(ctx))
	must(t, s.SetMarkers(ctx, []index.Marker{{Key: "after", Version: 1}}))
	want := dump(t, s)
	must(t, s.Close())
	must(t, os.WriteFile(filepath.Join(dir, wal.LogName(1)), old, 0o640))
	must(t, os.WriteFile(filepath.Join(dir, wal.TempSnapshotName), []byte("half a snapshot"), 0o640))

	s = open(t, dir, Options{})
	sameState(t, dump(t, s), want)
	for _, name := range []string{wal.LogName(1), wal.TempSnapshotName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed at Open: %v", name, err)
		}
	}
}

func TestConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	const dim, writers, rounds = 16, 8, 40
	dir := t.TempDir()
	s := open(t, dir, Options{CompactBytes: 64 << 10})
	must(t, s.Ensure(ctx, dim))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			key := fmt.Sprint("writer-", w)
			for v := int64(1); v <= rounds; v++ {
				if err := s.Upsert(ctx, docPoints(r, key, v, 1+int(v)%4, dim)); err != nil {
					t.Error(err)
					return
				}
				if err := s.DeleteStale(ctx, []index.Keep{{Key: key, Version: v}}); err != nil {
					t.Error(err)
					return
				}
				if err := s.SetMarkers(ctx, []index.Marker{{Key: key, Version: v}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var readers sync.WaitGroup
	readers.Go(func() {
		r := rand.New(rand.NewPCG(99, 1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Search(ctx, randVec(r, dim), 5); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Counts(ctx, []string{"writer-0", "writer-1"}); err != nil {
				t.Error(err)
				return
			}
			if err := s.ScanMarkers(ctx, func(index.Marker) error { return nil }); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()

	check := func(s *Store) {
		t.Helper()
		for w := range writers {
			key := fmt.Sprint("writer-", w)
			ps, err := s.Points(ctx, key, false)
			must(t, err)
			if len(ps) != 1+rounds%4 {
				t.Fatalf("%s has %d points, want %d", key, len(ps), 1+rounds%4)
			}
			for _, p := range ps {
				if p.Version != rounds {
					t.Fatalf("%s has a point of version %d", key, p.Version)
				}
			}
			ms, err := s.Markers(ctx, []string{key})
			must(t, err)
			if ms[key].Version != rounds {
				t.Fatalf("%s marker %v", key, ms[key])
			}
		}
	}
	check(s)
	want := dump(t, s)
	must(t, s.Close())
	s = open(t, dir, Options{})
	check(s)
	sameState(t, dump(t, s), want)
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.Close())
	must(t, s.Close())
	errs := []error{
		s.Ensure(ctx, 4),
		s.SetMarkers(ctx, []index.Marker{{Key: "k", Version: 1}}),
		s.DeleteStale(ctx, []index.Keep{{Key: "k"}}),
		s.ScanMarkers(ctx, func(index.Marker) error { return nil }),
		s.Compact(ctx),
	}
	_, err := s.Search(ctx, []float32{1}, 1)
	errs = append(errs, err)
	_, err = s.Counts(ctx, nil)
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call %d after Close: %v", i, err)
		}
	}
}

func TestScanMarkersStopsOnError(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.SetMarkers(ctx, []index.Marker{{Key: "a", Version: 1}, {Key: "b", Version: 1}, {Key: "c", Version: 1}}))
	stop := errors.New("stop")
	calls := 0
	err := s.ScanMarkers(ctx, func(index.Marker) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("ScanMarkers: %v after %d calls", err, calls)
	}
}

func fileSize(t testing.TB, path string) int64 { return waltest.FileSize(t, path) }

func truncateAt(n int64) func(t *testing.T, path string, start, end int64) {
	return func(t *testing.T, path string, start, end int64) {
		must(t, os.Truncate(path, start+n))
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	must(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b, off)
	must(t, err)
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	must(t, err)
}

// Points and deletions are synced with the markers written after them: one
// sync per applied batch. SetMarkers syncs even when no marker changes (a
// repair rewrites the points of the version the marker holds).
func TestPointsAreSyncedWithTheMarkers(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), Options{})
	must(t, s.Ensure(ctx, 2))
	if n := s.log.Unsynced(); n != 0 {
		t.Fatalf("%d bytes unsynced after Ensure", n)
	}
	must(t, s.Upsert(ctx, []index.Point{mkPoint("a", 1, 0, []float32{1, 0})}))
	if s.log.Unsynced() == 0 {
		t.Fatal("Upsert synced on its own")
	}
	must(t, s.SetMarkers(ctx, []index.Marker{{Key: "a", Version: 1}}))
	if n := s.log.Unsynced(); n != 0 {
		t.Fatalf("%d bytes unsynced after SetMarkers", n)
	}
	must(t, s.Upsert(ctx, []index.Point{mkPoint("a", 2, 0, []float32{0, 1})}))
	must(t, s.DeleteStale(ctx, []index.Keep{{Key: "a", Version: 2}}))
	if s.log.Unsynced() == 0 {
		t.Fatal("DeleteStale synced on its own")
	}
	must(t, s.SetMarkers(ctx, []index.Marker{{Key: "a", Version: 1}})) // changes nothing
	if n := s.log.Unsynced(); n != 0 {
		t.Fatalf("%d bytes unsynced after a SetMarkers that changed nothing", n)
	}
}

// A snapshot of many records (more than two records' worth of points of
// documents of different sizes, the last record the shortest) reads back
// as the index it was written from: its records share one buffer while
// written.
func TestSnapshotOfManyRecords(t *testing.T) {
	ctx := context.Background()
	const dim, docs = 8, 150
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(5, 6))
	s := open(t, dir, Options{CompactBytes: -1})
	must(t, s.Ensure(ctx, dim))
	points := 0
	for d := range docs {
		// Seven points each: the record size (256) is no multiple of 7,
		// so records of exactly that size would split documents.
		ps := docPoints(r, fmt.Sprint("doc-", d), 1, 7, dim)
		points += len(ps)
		must(t, s.Upsert(ctx, ps))
		must(t, s.SetMarkers(ctx, []index.Marker{{Key: fmt.Sprint("doc-", d), Version: 1}}))
	}
	if points <= 2*snapshotPointBatch || points%snapshotPointBatch == 0 {
		t.Fatalf("%d points: want more than two records' worth and a shorter last record", points)
	}
	must(t, s.Compact(ctx))
	want := dump(t, s)
	must(t, s.Close())
	s = open(t, dir, Options{})
	sameState(t, dump(t, s), want)
	// No record boundary splits a document: each is packed whole again.
	checkHeldStrings(t, s, "after a compaction of many records and a reopen")
}
