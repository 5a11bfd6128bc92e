package qdrant_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
)

// ScanKeys names every document the collection holds anything of, one
// with chunk points but no marker (a first write stopped before it)
// included; WipeDocuments deletes every point of the documents named,
// their markers included, and nothing of the others: after it their
// events apply again as to a collection that never held them.
func TestWipeDocuments(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, func(c *qdrant.Config) { c.BatchSize = 2 })
		keys := []string{"a", "b", "c", "d"}
		var points []index.Point
		var markers []index.Marker
		for _, key := range keys {
			for o := range 3 {
				points = append(points, chunk(key, 2, o, axis(o)))
			}
			markers = append(markers, index.Marker{Key: key, Version: 2})
		}
		must(t, b.SetMarkers(ctx(), markers))
		must(t, b.Upsert(ctx(), points))
		must(t, b.Upsert(ctx(), []index.Point{chunk("unmarked", 1, 0, axis(0))}))
		found := map[string]bool{}
		must(t, b.ScanKeys(ctx(), func(key string) error { found[key] = true; return nil }))
		if want := []string{"a", "b", "c", "d", "unmarked"}; !slices.Equal(slices.Sorted(maps.Keys(found)), want) {
			t.Fatalf("ScanKeys found %v; want %v", slices.Sorted(maps.Keys(found)), want)
		}
		must(t, b.WipeDocuments(ctx(), []string{"c", "a", "a", "gone", "unmarked"}))
		if pts, err := b.Points(ctx(), "unmarked", false); err != nil || len(pts) != 0 {
			t.Errorf("the unmarked document after the wipe: %d points, %v", len(pts), err)
		}
		got, err := b.Markers(ctx(), keys)
		must(t, err)
		for _, key := range keys {
			pts, err := b.Points(ctx(), key, false)
			must(t, err)
			_, marked := got[key]
			wiped := key == "a" || key == "c"
			if wiped && (marked || len(pts) != 0) {
				t.Errorf("%s after the wipe: marker %v, %d points; want neither", key, marked, len(pts))
			}
			if !wiped && (!marked || len(pts) != 3) {
				t.Errorf("%s, not wiped: marker %v, %d points; want its marker and 3 points", key, marked, len(pts))
			}
		}
		// A version at or below the one wiped writes its marker again.
		must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "a", Version: 1}}))
		got, err = b.Markers(ctx(), []string{"a"})
		must(t, err)
		if got["a"].Version != 1 {
			t.Errorf("a's marker after an older version than the wiped one: %+v; want version 1", got["a"])
		}
		must(t, b.WipeDocuments(ctx(), nil))
	})
}
