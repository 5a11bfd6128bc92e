package qdrant_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	qd "github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

const dim = 8

func ctx() context.Context { return context.Background() }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// open returns a backend on the model srv; edit adjusts its
// configuration. (server.open opens one on either server.)
func open(t testing.TB, srv *qdranttest.Server, edit func(*qdrant.Config)) *qdrant.Backend {
	t.Helper()
	cfg := qdrant.Config{Addr: srv.Addr()}
	if edit != nil {
		edit(&cfg)
	}
	b, err := qdrant.New(ctx(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// ensured returns a backend on a fresh model with its collection created.
func ensured(t testing.TB, edit func(*qdrant.Config)) (*qdrant.Backend, *qdranttest.Server) {
	t.Helper()
	srv := qdranttest.Start(t)
	b := open(t, srv, edit)
	must(t, b.Ensure(ctx(), dim))
	return b, srv
}

func axis(i int) []float32 {
	v := make([]float32, dim)
	v[i%dim] = 1
	return v
}

func chunk(key string, version int64, ordinal int, vec []float32) index.Point {
	text := fmt.Sprintf("%s v%d #%d", key, version, ordinal)
	return index.Point{
		ID: contract.ChunkID(key, version, ordinal), Key: key, Version: version, Ordinal: ordinal,
		ContentHash: fmt.Sprintf("h-%s-%d", key, version), ChunkHash: contract.TextHash(text),
		Title: "T " + key, Tags: []string{"t1", "t2"}, Text: text, Vector: vec,
	}
}

func versionsOf(points []index.Point) []string {
	out := make([]string, len(points))
	for i, p := range points {
		out[i] = fmt.Sprintf("v%d#%d", p.Version, p.Ordinal)
	}
	return out
}

// On the model alone: it counts the requests (Calls).
func TestEnsureIsIdempotent(t *testing.T) {
	b, srv := ensured(t, nil)
	must(t, b.Ensure(ctx(), dim))
	if n := srv.Calls("Collections/Create"); n != 1 {
		t.Fatalf("collection created %d times; want 1", n)
	}
	if n := srv.Calls("Points/CreateFieldIndex"); n != 5 {
		t.Fatalf("%d payload indexes created; want 5 (key, type, version, version_high, version_low), once", n)
	}
	// A second process finds everything in place.
	must(t, open(t, srv, nil).Ensure(ctx(), dim))
	if n := srv.Calls("Collections/Create") + srv.Calls("Points/CreateFieldIndex"); n != 6 {
		t.Fatalf("a second Ensure changed the collection (%d create calls in all)", n)
	}
}

func TestEnsureRejectsAnotherDimension(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		err := b.Ensure(ctx(), dim*2)
		if !errors.Is(err, qdrant.ErrDimensionMismatch) {
			t.Fatalf("Ensure(%d) on a collection of %d: %v; want ErrDimensionMismatch", dim*2, dim, err)
		}
		for _, want := range []string{fmt.Sprint(dim), fmt.Sprint(dim * 2), s.collection()} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name %s", err, want)
			}
		}
	})
}

func TestCallsBeforeEnsureAreNotFound(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		nothing := s.name("nothing_yet")
		b := s.open(t, func(c *qdrant.Config) { c.Collection = nothing })
		checks := map[string]error{
			"Upsert":      b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0))}),
			"SetMarkers":  b.SetMarkers(ctx(), []index.Marker{{Key: "a", Version: 1}}),
			"DeleteStale": b.DeleteStale(ctx(), []index.Keep{{Key: "a"}}),
		}
		_, checks["Counts"] = b.Counts(ctx(), []string{"a"})
		_, checks["Points"] = b.Points(ctx(), "a", false)
		_, checks["Markers"] = b.Markers(ctx(), []string{"a"})
		_, checks["Search"] = b.Search(ctx(), axis(0), 3)
		checks["ScanMarkers"] = b.ScanMarkers(ctx(), func(index.Marker) error { return nil })
		for name, err := range checks {
			if !errors.Is(err, qdrant.ErrCollectionNotFound) || status.Code(err) != codes.NotFound {
				t.Errorf("%s before Ensure: %v; want a NotFound error", name, err)
			}
			var qe *qdrant.Error
			if !errors.As(err, &qe) || qe.Collection != nothing || qe.Code() != codes.NotFound || qe.SafeToRetry() {
				t.Errorf("%s before Ensure: %#v; want a *qdrant.Error naming the collection, not retryable", name, err)
			}
		}
	})
}

func TestMarkersNeverGoBack(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		must(t, b.SetMarkers(ctx(), []index.Marker{
			{Key: "a", Version: 5, ContentHash: "a5"},
			{Key: "b", Version: 2, Deleted: true, ContentHash: "b2"},
			{Key: "a", Version: 4, ContentHash: "a4"}, // older duplicate in the same call
		}))
		must(t, b.SetMarkers(ctx(), []index.Marker{
			{Key: "a", Version: 3, ContentHash: "a3"},    // older: ignored by the server
			{Key: "a", Version: 5, ContentHash: "other"}, // equal: ignored too
			{Key: "b", Version: 3, ContentHash: "b3"},    // newer: replaces the withdrawal
			{Key: "c", Version: 1, ContentHash: "c1"},    // new key: inserted
		}))
		got, err := b.Markers(ctx(), []string{"a", "b", "c", "missing", "a"})
		must(t, err)
		want := map[string]index.Marker{
			"a": {Key: "a", Version: 5, ContentHash: "a5"},
			"b": {Key: "b", Version: 3, ContentHash: "b3"},
			"c": {Key: "c", Version: 1, ContentHash: "c1"},
		}
		if len(got) != len(want) {
			t.Fatalf("markers %v; want %v", got, want)
		}
		for k, m := range want {
			if got[k] != m {
				t.Fatalf("marker %q = %+v; want %+v", k, got[k], m)
			}
		}
		// The guard is the server's: every marker write carries
		// update_filter, and the older ones were sent.
		if s.model != nil {
			if n := s.model.Calls("Points/Upsert"); n != 2 {
				t.Fatalf("%d upsert requests; want 2", n)
			}
		}
		// Markers are not chunks.
		counts, err := b.Counts(ctx(), []string{"a"})
		must(t, err)
		if counts["a"] != 0 {
			t.Fatalf("markers counted as chunks: %v", counts)
		}
		if hits, err := b.Search(ctx(), axis(0), 10); err != nil || len(hits) != 0 {
			t.Fatalf("search found markers: %v, %v", hits, err)
		}
	})
}

// TestMarkerVersionsCompareExactly uses versions beyond 2^53, where a float
// comparison of the whole version would see 2^60+1 and 2^60+2 as equal.
func TestMarkerVersionsCompareExactly(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		base := int64(1) << 60
		for _, step := range []struct {
			version int64
			want    int64
		}{
			{base + 1, base + 1},
			{base + 2, base + 2},         // newer by one: written
			{base + 1, base + 2},         // older by one: ignored
			{base + 1<<32, base + 1<<32}, // newer in the high half
			{base + 3, base + 1<<32},     // older high half, larger low half: ignored
			{math.MaxInt64, math.MaxInt64},
		} {
			must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "k", Version: step.version}}))
			got, err := b.Markers(ctx(), []string{"k"})
			must(t, err)
			if got["k"].Version != step.want {
				t.Fatalf("after setting %d: stored %d; want %d", step.version, got["k"].Version, step.want)
			}
		}
	})
}

func TestUpsertReplacesByID(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		must(t, b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0)), chunk("a", 1, 1, axis(1))}))
		changed := chunk("a", 1, 1, axis(2))
		changed.Text, changed.Tags = "rewritten", nil
		must(t, b.Upsert(ctx(), []index.Point{changed}))
		got, err := b.Points(ctx(), "a", true)
		must(t, err)
		if len(got) != 2 {
			t.Fatalf("%d points after replacing one; want 2", len(got))
		}
		want := chunk("a", 1, 0, axis(0))
		if !samePoint(got[0], want) || got[1].Text != "rewritten" || got[1].Tags != nil || !slices.Equal(got[1].Vector, axis(2)) {
			t.Fatalf("points %+v", got)
		}
	})
}

func samePoint(a, b index.Point) bool {
	return a.ID == b.ID && a.Key == b.Key && a.Version == b.Version && a.Ordinal == b.Ordinal &&
		a.ContentHash == b.ContentHash && a.ChunkHash == b.ChunkHash && a.Title == b.Title &&
		slices.Equal(a.Tags, b.Tags) && a.Text == b.Text && slices.Equal(a.Vector, b.Vector)
}

// On the model alone: it counts the requests and those in flight.
func TestUpsertSplitsIntoParallelBatches(t *testing.T) {
	b, srv := ensured(t, func(c *qdrant.Config) { c.BatchSize, c.Parallel = 7, 3 })
	var points []index.Point
	for i := range 100 {
		points = append(points, chunk(fmt.Sprintf("doc-%d", i%10), 1, i/10, axis(i)))
	}
	must(t, b.Upsert(ctx(), points))
	if n := srv.Calls("Points/Upsert"); n != 15 { // ceil(100/7)
		t.Fatalf("%d upsert requests; want 15", n)
	}
	if n := srv.MaxInFlight("Points/Upsert"); n > 3 {
		t.Fatalf("%d upserts in flight at once; Parallel is 3", n)
	}
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("doc-%d", i)
	}
	counts, err := b.Counts(ctx(), keys)
	must(t, err)
	for _, k := range keys {
		if counts[k] != 10 {
			t.Fatalf("counts %v; want 10 per key", counts)
		}
	}
}

func TestDeleteStaleKeepsOnlyTheKeptVersion(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, func(c *qdrant.Config) { c.BatchSize = 2 })
		var points []index.Point
		for v := int64(1); v <= 3; v++ {
			for o := range 3 {
				points = append(points, chunk("a", v, o, axis(o)), chunk("b", v, o, axis(o)), chunk("c", v, o, axis(o)))
			}
		}
		must(t, b.Upsert(ctx(), points))
		must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "b", Version: 3}}))
		var before int
		if s.model != nil {
			before = s.model.Calls("Points/Delete")
		}
		must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "a", Version: 2}, {Key: "b", Version: 0}, {Key: "c", Version: 3}}))
		if s.model != nil {
			if n := s.model.Calls("Points/Delete") - before; n != 2 {
				t.Fatalf("%d delete requests for 3 keeps in batches of 2; want 2", n)
			}
		}
		for key, want := range map[string][]string{
			"a": {"v2#0", "v2#1", "v2#2", "v3#0", "v3#1", "v3#2"}, // never a newer version's
			"b": {},
			"c": {"v3#0", "v3#1", "v3#2"},
		} {
			got, err := b.Points(ctx(), key, false)
			must(t, err)
			if !slices.Equal(versionsOf(got), want) {
				t.Fatalf("%s keeps %v; want %v", key, versionsOf(got), want)
			}
		}
		markers, err := b.Markers(ctx(), []string{"b"})
		must(t, err)
		if markers["b"].Version != 3 {
			t.Fatalf("DeleteStale removed the marker of b: %v", markers)
		}
	})
}

func TestCounts(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		var points []index.Point
		for o := range 3 {
			points = append(points, chunk("three", 1, o, axis(o)))
		}
		for o := range 5 {
			points = append(points, chunk("five", int64(1+o%2), o, axis(o)))
		}
		must(t, b.Upsert(ctx(), points))
		got, err := b.Counts(ctx(), []string{"three", "five", "none", "three"})
		must(t, err)
		if len(got) != 3 || got["three"] != 3 || got["five"] != 5 || got["none"] != 0 {
			t.Fatalf("counts %v; want three:3 five:5 none:0", got)
		}
	})
}

func TestPointsAreOrderedByVersionThenOrdinal(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		var points []index.Point
		for v := int64(1); v <= 3; v++ {
			for o := range 300 { // more than one scroll page
				points = append(points, chunk("big", v, o, axis(o)))
			}
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(points), func(i, j int) { points[i], points[j] = points[j], points[i] })
		must(t, b.Upsert(ctx(), append(points, chunk("other", 1, 0, axis(0)))))

		got, err := b.Points(ctx(), "big", false)
		must(t, err)
		if len(got) != 900 {
			t.Fatalf("%d points; want 900", len(got))
		}
		for i, p := range got {
			if p.Version != int64(1+i/300) || p.Ordinal != i%300 || p.Vector != nil || p.Key != "big" {
				t.Fatalf("point %d is %s v%d#%d (vector %v); want big v%d#%d without vector", i, p.Key, p.Version, p.Ordinal, p.Vector, 1+i/300, i%300)
			}
		}
		got, err = b.Points(ctx(), "big", true)
		must(t, err)
		if !slices.Equal(got[301].Vector, axis(1)) || !samePoint(got[301], chunk("big", 2, 1, axis(1))) {
			t.Fatalf("point with vector %+v; want %+v", got[301], chunk("big", 2, 1, axis(1)))
		}
	})
}

func TestScanMarkers(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		var markers []index.Marker
		for i := range 600 { // more than two scroll pages
			markers = append(markers, index.Marker{Key: fmt.Sprintf("k%03d", i), Version: int64(i + 1), Deleted: i%7 == 0, ContentHash: fmt.Sprint(i)})
		}
		must(t, b.SetMarkers(ctx(), markers))
		must(t, b.Upsert(ctx(), []index.Point{chunk("k001", 2, 0, axis(0))}))
		seen := make(map[string]index.Marker)
		must(t, b.ScanMarkers(ctx(), func(m index.Marker) error {
			if _, dup := seen[m.Key]; dup {
				return fmt.Errorf("marker %q seen twice", m.Key)
			}
			seen[m.Key] = m
			return nil
		}))
		if len(seen) != len(markers) {
			t.Fatalf("scanned %d markers; want %d", len(seen), len(markers))
		}
		for _, m := range markers {
			if seen[m.Key] != m {
				t.Fatalf("scanned %+v; want %+v", seen[m.Key], m)
			}
		}
		stop := errors.New("stop")
		calls := 0
		err := b.ScanMarkers(ctx(), func(index.Marker) error { calls++; return stop })
		if !errors.Is(err, stop) || calls != 1 {
			t.Fatalf("ScanMarkers after fn failed: %v after %d calls; want fn's error after 1", err, calls)
		}
	})
}

func TestSearchRanksByCosine(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		near := []float32{1, 0.1, 0, 0, 0, 0, 0, 0}
		mid := []float32{1, 1, 0, 0, 0, 0, 0, 0}
		must(t, b.Upsert(ctx(), []index.Point{
			chunk("far", 1, 0, axis(3)),
			chunk("mid", 1, 0, mid),
			chunk("near", 1, 0, near),
			chunk("exact", 1, 0, []float32{5, 0, 0, 0, 0, 0, 0, 0}),
		}))
		must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "exact", Version: 1}}))
		hits, err := b.Search(ctx(), axis(0), 3)
		must(t, err)
		var keys []string
		for _, h := range hits {
			keys = append(keys, h.Point.Key)
			if h.Point.Vector != nil || h.Point.Text == "" {
				t.Fatalf("hit %+v: want the payload without the vector", h.Point)
			}
		}
		if !slices.Equal(keys, []string{"exact", "near", "mid"}) {
			t.Fatalf("ranking %v; want [exact near mid]", keys)
		}
		if math.Abs(float64(hits[0].Score)-1) > 1e-6 || math.Abs(float64(hits[2].Score)-1/math.Sqrt2) > 1e-6 {
			t.Fatalf("scores %v, %v; want 1 and 1/sqrt(2)", hits[0].Score, hits[2].Score)
		}
		if hits, err := b.Search(ctx(), axis(0), 0); err != nil || hits != nil {
			t.Fatalf("Search with k=0: %v, %v", hits, err)
		}
	})
}

// TestSearchBreaksTiesByID has more equal scores than k: the server orders
// them by descending id, the backend must return the smallest ids.
func TestSearchBreaksTiesByID(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		var points []index.Point
		var ids []uuid.UUID
		for i := range 9 {
			p := chunk(fmt.Sprintf("dup-%d", i), 1, 0, axis(0))
			points = append(points, p)
			ids = append(ids, p.ID)
		}
		points = append(points, chunk("second", 1, 0, []float32{1, 0.1, 0, 0, 0, 0, 0, 0}), chunk("other", 1, 0, axis(1)))
		must(t, b.Upsert(ctx(), points))
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range []int{1, 3, 4, 10, 11, 12} {
			hits, err := b.Search(ctx(), axis(0), k)
			must(t, err)
			var got []uuid.UUID
			for _, h := range hits {
				got = append(got, h.Point.ID)
			}
			want := ids[:min(k, 9)]
			switch {
			case k == 10:
				want = append(slices.Clone(ids), contract.ChunkID("second", 1, 0))
			case k > 10:
				want = append(slices.Clone(ids), contract.ChunkID("second", 1, 0), contract.ChunkID("other", 1, 0))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("k=%d: ids %v; want %v", k, got, want)
			}
		}
	})
}

func TestAPIKey(t *testing.T) {
	onBothKeyed(t, func(t *testing.T, s server) {
		// Qdrant's health check is open, so New succeeds without the
		// key; the first real request does not.
		err := s.open(t, func(c *qdrant.Config) { c.APIKey = "" }).Ensure(ctx(), dim)
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Ensure without the key: %v; want Unauthenticated", err)
		}
		err = s.open(t, func(c *qdrant.Config) { c.APIKey = "wrong" }).Ensure(ctx(), dim)
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Ensure with a wrong key: %v; want Unauthenticated", err)
		}
		b := s.ensured(t, nil)
		must(t, b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0))}))
	})
}

// On the model alone, which can claim another version (WithVersion).
func TestNewRejectsServersWithoutConditionalUpdates(t *testing.T) {
	srv := qdranttest.Start(t, qdranttest.WithVersion("1.15.4"))
	_, err := qdrant.New(ctx(), qdrant.Config{Addr: srv.Addr()})
	if err == nil || !strings.Contains(err.Error(), "1.15.4") {
		t.Fatalf("New against Qdrant 1.15.4: %v; want an error naming the version", err)
	}
}

// The alias switch of a rebuild: readers of the alias move from one
// collection to the next in one request, a switch to a missing collection
// leaves the alias alone, and the collection the alias left can be
// dropped, the one it names cannot.
func TestSwitchAlias(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		chunksV1, chunksV2, alias := s.name("chunks_v1"), s.name("chunks_v2"), s.name("live")
		v1 := s.open(t, func(c *qdrant.Config) { c.Collection = chunksV1 })
		v2 := s.open(t, func(c *qdrant.Config) { c.Collection = chunksV2 })
		must(t, v1.Ensure(ctx(), dim))
		must(t, v2.Ensure(ctx(), dim))
		must(t, v1.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0))}))
		must(t, v2.Upsert(ctx(), []index.Point{chunk("a", 2, 0, axis(0)), chunk("a", 2, 1, axis(1))}))

		live := s.open(t, func(c *qdrant.Config) { c.Collection = alias })
		if _, err := live.Counts(ctx(), []string{"a"}); !errors.Is(err, qdrant.ErrCollectionNotFound) {
			t.Fatalf("alias before it exists: %v; want ErrCollectionNotFound", err)
		}
		count := func() int {
			t.Helper()
			n, err := live.Counts(ctx(), []string{"a"})
			must(t, err)
			return n["a"]
		}
		must(t, live.SwitchAlias(ctx(), alias, chunksV1)) // creates the alias
		must(t, live.Ensure(ctx(), dim))                  // resolves through it
		if n := count(); n != 1 {
			t.Fatalf("live -> v1: %d points; want 1", n)
		}
		var before int
		if s.model != nil {
			before = s.model.Calls("Collections/UpdateAliases")
		}
		must(t, live.SwitchAlias(ctx(), alias, chunksV2))
		if s.model != nil {
			if n := s.model.Calls("Collections/UpdateAliases") - before; n != 1 {
				t.Fatalf("the switch took %d requests; want 1", n)
			}
		}
		if n := count(); n != 2 {
			t.Fatalf("live -> v2: %d points; want 2", n)
		}
		err := live.SwitchAlias(ctx(), alias, s.name("chunks_v3"))
		if !errors.Is(err, qdrant.ErrCollectionNotFound) {
			t.Fatalf("switch to a missing collection: %v; want ErrCollectionNotFound", err)
		}
		if n := count(); n != 2 {
			t.Fatalf("a failed switch moved the alias: %d points; want 2", n)
		}

		// The rebuild's last step: drop the collection the alias left.
		if err := live.DropCollection(ctx(), chunksV2); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("alias %q", alias)) {
			t.Fatalf("dropping the alias's collection: %v; want a refusal naming the alias", err)
		}
		must(t, live.DropCollection(ctx(), chunksV1))
		must(t, live.DropCollection(ctx(), chunksV1)) // already gone
		if _, err := v1.Counts(ctx(), []string{"a"}); !errors.Is(err, qdrant.ErrCollectionNotFound) {
			t.Fatalf("v1 after the drop: %v; want ErrCollectionNotFound", err)
		}
		if n := count(); n != 2 {
			t.Fatalf("live after dropping v1: %d points; want 2", n)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  qdrant.Config
		want string // "" for valid
	}{
		{qdrant.Config{Addr: "localhost:6334"}, ""},
		{qdrant.Config{Addr: "[::1]:6334", BatchSize: 1024, Parallel: 64, Collection: "x"}, ""},
		{qdrant.Config{Addr: "http://qdrant.internal:6334"}, ""},
		{qdrant.Config{Addr: "https://qdrant.example:6334/"}, ""},
		{qdrant.Config{Addr: "grpc://qdrant.internal:6334"}, "scheme"},
		{qdrant.Config{}, "address"},
		{qdrant.Config{Addr: "localhost"}, "address"},
		{qdrant.Config{Addr: ":6334"}, "host"},
		{qdrant.Config{Addr: "localhost:0"}, "port"},
		{qdrant.Config{Addr: "localhost:6334", BatchSize: 1025}, "batch size"},
		{qdrant.Config{Addr: "localhost:6334", BatchSize: -1}, "batch size"},
		{qdrant.Config{Addr: "localhost:6334", Parallel: -2}, "parallel"},
		{qdrant.Config{Addr: "localhost:6334", Collection: "a/b"}, "collection"},
		{qdrant.Config{Addr: "localhost:6334", Timeout: -1}, "timeout"},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v; want %q", tc.cfg, err, tc.want)
		}
	}
}

// A request Qdrant rejects (here a vector of the wrong size) is permanent
// to the projector runtime, which dead-letters the event after its
// redeliveries; an unreachable server is not, and is retried. (On the
// model alone, which can be stopped.)
func TestRejectionsArePermanentOutagesAreNot(t *testing.T) {
	b, srv := ensured(t, nil)
	err := b.Upsert(ctx(), []index.Point{chunk("k", 1, 0, make([]float32, dim+3))})
	if err == nil || !projector.IsPermanent(err) {
		t.Fatalf("upsert of a wrong-size vector: %v; want a permanent error", err)
	}
	srv.Stop()
	err = b.Upsert(ctx(), []index.Point{chunk("k", 1, 0, axis(1))})
	if err == nil || projector.IsPermanent(err) {
		t.Fatalf("upsert to a stopped server: %v; want a transient error", err)
	}
}

// Qdrant's CollectionExists is true for an alias; the backend's is not, and
// a switch to an alias does not go ahead (it would delete the alias and
// fail to recreate it).
func TestAliasIsNotACollection(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		chunksV1, live, old, missing := s.name("chunks_v1"), s.name("live"), s.name("old"), s.name("missing")
		v1 := s.open(t, func(c *qdrant.Config) { c.Collection = chunksV1 })
		must(t, v1.Ensure(ctx(), dim))
		must(t, v1.SwitchAlias(ctx(), live, chunksV1))
		for name, want := range map[string]bool{chunksV1: true, live: false, missing: false} {
			got, err := v1.CollectionExists(ctx(), name)
			must(t, err)
			if got != want {
				t.Errorf("CollectionExists(%q) = %v; want %v", name, got, want)
			}
		}
		// Qdrant would apply the delete of "old" and then refuse the create.
		must(t, v1.SwitchAlias(ctx(), old, chunksV1))
		if err := v1.SwitchAlias(ctx(), old, live); err == nil || !strings.Contains(err.Error(), "is an alias") {
			t.Errorf("switching an alias to an alias: %v; want a refusal naming the alias", err)
		}
		if target, err := v1.AliasTarget(ctx(), old); err != nil || target != chunksV1 {
			t.Errorf("after the refused switch, alias old -> %q, %v; want chunks_v1", target, err)
		}
		// No collection of that name is left: dropping it sends nothing,
		// and leaves the alias and its collection.
		must(t, v1.DropCollection(ctx(), live))
		if s.model != nil {
			if n := s.model.Calls("Collections/Delete"); n != 0 {
				t.Errorf("DropCollection of an alias name sent %d collection deletes; want none", n)
			}
		}
		if target, err := v1.AliasTarget(ctx(), live); err != nil || target != chunksV1 {
			t.Errorf("alias live -> %q, %v; want chunks_v1", target, err)
		}
		if exists, err := v1.CollectionExists(ctx(), chunksV1); err != nil || !exists {
			t.Errorf("chunks_v1 after dropping its alias's name: %v, %v; want it there", exists, err)
		}
	})
}

// Each gRPC code as Qdrant means it (its StorageError to tonic mapping):
// a refusal of the request is permanent, a state of the server is
// transient and safe to retry, and a refusal of the key (Unauthenticated,
// PermissionDenied) is neither: it holds for every event alike until the
// operator fixes the key, so it is retried rather than dead-lettered.
func TestErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		code             codes.Code
		permanent, retry bool
	}{
		{codes.InvalidArgument, true, false},
		{codes.PermissionDenied, false, false},
		{codes.Unauthenticated, false, false},
		{codes.Internal, false, true},
		{codes.FailedPrecondition, false, true},
		{codes.Unavailable, false, true},
		{codes.ResourceExhausted, false, true},
		{codes.NotFound, false, false},
	} {
		err := &qdrant.Error{Op: "upsert", Collection: "c", Err: status.Error(tc.code, "x")}
		if err.Permanent() != tc.permanent || projector.IsPermanent(err) != tc.permanent || err.SafeToRetry() != tc.retry {
			t.Errorf("%v: Permanent %v, SafeToRetry %v; want %v, %v", tc.code, err.Permanent(), err.SafeToRetry(), tc.permanent, tc.retry)
		}
	}
}

// A collection at a strict-mode capacity limit refuses every upsert alike
// with InvalidArgument: that is a state of the collection, so the error is
// not permanent (the event is retried, not dead-lettered) and names the
// setting, while a limit on the request itself stays permanent. Qdrant
// sees the limit reached by a cache of the collection's size that it
// takes at every 32nd upsert, so the refusal comes some upserts late.
func TestCapacityLimitIsNotPermanent(t *testing.T) {
	for _, tc := range []struct {
		message   string
		permanent bool
		setting   string
	}{
		{"Bad request: Max points count limit of 5 reached!", false, "max_points_count"},
		{"Bad request: Max vector storage size limit of 1.5MB reached!", false, "max_collection_vector_size_bytes"},
		{"Bad request: Max payload storage size limit of 2MB reached!", false, "max_collection_payload_size_bytes"},
		{"Bad request: Filter condition limit reached (3 > 2). Help: Reduce the amount of conditions of your filter.", true, ""},
		{"Bad request: Limit exceeded 300 > 256 for \"upsert limit\". Help: Reduce the \"upsert limit\" parameter to or below 256.", true, ""},
	} {
		err := &qdrant.Error{Op: "upsert", Collection: "c", Err: status.Error(codes.InvalidArgument, tc.message)}
		if projector.IsPermanent(err) != tc.permanent || errors.Is(err, qdrant.ErrCollectionFull) == tc.permanent ||
			!strings.Contains(err.Error(), tc.setting) {
			t.Errorf("%q: permanent %v, full %v, %q; want permanent %v, naming %q",
				tc.message, projector.IsPermanent(err), errors.Is(err, qdrant.ErrCollectionFull), err, tc.permanent, tc.setting)
		}
	}

	onBoth(t, func(t *testing.T, s server) {
		s.createWith(t, &qd.CreateCollection{StrictModeConfig: &qd.StrictModeConfig{Enabled: qd.PtrOf(true), MaxPointsCount: qd.PtrOf(uint64(2))}})
		b := s.ensured(t, nil)
		must(t, b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0)), chunk("a", 1, 1, axis(1))}))
		var err error
		upserts := 1
		for ; err == nil && upserts <= 40; upserts++ {
			err = b.Upsert(ctx(), []index.Point{chunk("b", 1, 0, axis(2))})
		}
		if err == nil || projector.IsPermanent(err) || !errors.Is(err, qdrant.ErrCollectionFull) || !strings.Contains(err.Error(), "max_points_count") {
			t.Fatalf("upsert into a full collection: %v; want a retried ErrCollectionFull naming max_points_count", err)
		}
		// Started again on the full collection, Ensure says so.
		if err := s.open(t, nil).Ensure(ctx(), dim); err == nil || !strings.Contains(err.Error(), "max_points_count is 2 and the collection holds 3 points") {
			t.Fatalf("Ensure on a full collection: %v; want an error naming max_points_count", err)
		}
	})
}

// Under strict mode's max_query_limit Search never asks for more: a k at
// or above the limit gets the limit's worth of hits, and a run of equal
// scores longer than the limit stops the widening at the limit, still
// ordered by id, instead of failing the search.
func TestSearchStaysWithinMaxQueryLimit(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		s.createWith(t, &qd.CreateCollection{StrictModeConfig: &qd.StrictModeConfig{Enabled: qd.PtrOf(true), MaxQueryLimit: qd.PtrOf(uint32(300))}})
		b := s.ensured(t, nil)
		var points []index.Point
		for o := range 400 {
			// Every point in the same direction: all scores tie.
			v := axis(0)
			v[1] = 1
			points = append(points, chunk("a", 1, o, v))
		}
		must(t, b.Upsert(ctx(), points))
		for _, k := range []int{10, 299, 300, 500} {
			hits, err := b.Search(ctx(), axis(0), k)
			if err != nil {
				t.Fatalf("Search k=%d under max_query_limit 300: %v", k, err)
			}
			// The server refuses a query over its limit (strict mode), so
			// an error above is what a request past it shows; the order
			// of the hits is Search's own sort, not the server's.
			if want := min(k, 300); len(hits) != want {
				t.Fatalf("Search k=%d: %d hits; want %d", k, len(hits), want)
			}
		}
	})
}

// Strict mode refuses requests over its limits as InvalidArgument, which
// would dead-letter every event: Ensure refuses the settings the backend
// cannot work under, naming each, and works under the rest.
//
// optimizers_config.prevent_unoptimized comes with Qdrant 1.17: Qdrant
// 1.16.3 (the real test server, and the model by default) does not know
// it, so there a collection created with it works; the model claiming
// 1.17.1 has it and Ensure refuses it.
func TestEnsureChecksStrictModeAndPreventUnoptimized(t *testing.T) {
	const preventUnoptimized = "prevent_unoptimized: writes are then not answered until their points are optimized, and counts and scrolls skip points not yet optimized"
	for _, tc := range []struct {
		name   string
		strict *qd.StrictModeConfig
		opt    *qd.OptimizersConfigDiff
		want   string // "" when Ensure succeeds
	}{
		{"exact counts", &qd.StrictModeConfig{Enabled: qd.PtrOf(true), SearchAllowExact: qd.PtrOf(false)}, nil, "search_allow_exact"},
		{"query limit", &qd.StrictModeConfig{Enabled: qd.PtrOf(true), MaxQueryLimit: qd.PtrOf(uint32(100))}, nil, "max_query_limit"},
		{"upsert batch", &qd.StrictModeConfig{Enabled: qd.PtrOf(true), UpsertMaxBatchsize: qd.PtrOf(uint64(64))}, nil, "upsert_max_batchsize"},
		{"filter conditions", &qd.StrictModeConfig{Enabled: qd.PtrOf(true), FilterMaxConditions: qd.PtrOf(uint64(100))}, nil, "filter_max_conditions"},
		{"prevent unoptimized, unknown to 1.16.3", nil, &qd.OptimizersConfigDiff{PreventUnoptimized: qd.PtrOf(true)}, ""},
		{"disabled", &qd.StrictModeConfig{Enabled: qd.PtrOf(false), SearchAllowExact: qd.PtrOf(false)}, nil, ""},
		{"workable", &qd.StrictModeConfig{Enabled: qd.PtrOf(true), UnindexedFilteringRetrieve: qd.PtrOf(false),
			UnindexedFilteringUpdate: qd.PtrOf(false), MaxQueryLimit: qd.PtrOf(uint32(1000)), UpsertMaxBatchsize: qd.PtrOf(uint64(500))}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onBoth(t, func(t *testing.T, s server) {
				s.createWith(t, &qd.CreateCollection{StrictModeConfig: tc.strict, OptimizersConfig: tc.opt})
				checkEnsure(t, s, tc.want)
			})
		})
	}
	t.Run("prevent unoptimized, 1.17", func(t *testing.T) {
		s := modelServer(t, qdranttest.WithVersion("1.17.1"))
		s.createWith(t, &qd.CreateCollection{OptimizersConfig: &qd.OptimizersConfigDiff{PreventUnoptimized: qd.PtrOf(true)}})
		checkEnsure(t, s, preventUnoptimized)
	})
}

// checkEnsure runs Ensure on s's collection: it must fail naming want, or
// with want "" succeed, and then every operation must go through.
func checkEnsure(t *testing.T, s server, want string) {
	t.Helper()
	b := s.open(t, nil)
	err := b.Ensure(ctx(), dim)
	if want != "" {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Ensure: %v; want an error naming %s", err, want)
		}
		// The settings are read before the write check, which a
		// collection deferring unoptimized points might not answer.
		if s.model != nil {
			if n := s.model.Calls("Points/Delete"); n != 0 {
				t.Fatalf("Ensure sent %d write checks before refusing the settings; want none", n)
			}
		}
		return
	}
	must(t, err)
	must(t, b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0)), chunk("a", 2, 0, axis(1))}))
	must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "a", Version: 2}}))
	must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "a", Version: 2}}))
	n, err := b.Counts(ctx(), []string{"a"})
	must(t, err)
	if n["a"] != 1 {
		t.Fatalf("count %v; want a:1", n)
	}
	_, err = b.Points(ctx(), "a", false)
	must(t, err)
	must(t, b.ScanMarkers(ctx(), func(index.Marker) error { return nil }))
	_, err = b.Search(ctx(), axis(0), 5)
	must(t, err)
}

// A key that may read but not write (Qdrant's read-only key) passes every
// read Ensure makes on a collection that is already set up; Ensure must
// still refuse it, naming the problem, so that the projector does not
// start and dead-letter or stall on every event. It does so whether or not
// the collection exists (Qdrant answers a point write on a missing
// collection with NotFound even to a read-only key, so there the refusal
// of the create is the answer), and a key that may write is let through.
func TestEnsureRefusesAKeyThatMayNotWrite(t *testing.T) {
	onBothKeyed(t, func(t *testing.T, s server) {
		rw := s.ensured(t, nil)
		must(t, rw.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0))}))
		for _, collection := range []string{s.collection(), s.name("not_yet_created")} {
			ro := s.open(t, func(c *qdrant.Config) { c.APIKey = s.readOnlyKey; c.Collection = collection })
			err := ro.Ensure(ctx(), dim)
			want := fmt.Sprintf("the API key may not write to collection %q: a read-only key, or one without access to this collection?", collection)
			if !errors.Is(err, qdrant.ErrWriteDenied) || !strings.Contains(err.Error(), want) || status.Code(err) != codes.PermissionDenied {
				t.Errorf("Ensure of %s with a read-only key: %v; want an error saying %q, with the PermissionDenied cause", collection, err, want)
			}
		}
		must(t, rw.Ensure(ctx(), dim))
		if counts, err := rw.Counts(ctx(), []string{"a"}); err != nil || counts["a"] != 1 {
			t.Fatalf("counts after Ensure checked the key: %v %v; want a: 1", counts, err)
		}
	})
}

// A key that loses the right to write after Ensure (the operator swapped
// it for a read-only one) fails every write alike, whatever the event:
// PermissionDenied is not permanent, so the runtime retries the event
// instead of dead-lettering it, and the write succeeds once the key may
// write again. (On the model alone, whose keys change without a restart.)
func TestPermissionDeniedDuringUpsertIsNotPermanent(t *testing.T) {
	srv := qdranttest.Start(t, qdranttest.WithAPIKey("key"))
	b := open(t, srv, func(c *qdrant.Config) { c.APIKey = "key" })
	must(t, b.Ensure(ctx(), dim))
	srv.SetAPIKeys("another", "key")
	points := []index.Point{chunk("a", 1, 0, axis(0))}
	err := b.Upsert(ctx(), points)
	var qe *qdrant.Error
	if !errors.As(err, &qe) || qe.Code() != codes.PermissionDenied {
		t.Fatalf("Upsert with a key made read-only: %v; want a PermissionDenied *qdrant.Error", err)
	}
	if projector.IsPermanent(err) || qe.Permanent() {
		t.Fatalf("Upsert with a key made read-only: %v is permanent; want it retried", err)
	}
	srv.SetAPIKeys("key", "")
	must(t, b.Upsert(ctx(), points))
}
