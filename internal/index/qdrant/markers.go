package qdrant

import (
	"context"
	"sync"

	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/index"
)

// Markers looks the markers of keys up by their point ids.
func (b *Backend) Markers(ctx context.Context, keys []string) (map[string]index.Marker, error) {
	keys = distinct(keys)
	out := make(map[string]index.Marker, len(keys))
	var mu sync.Mutex
	err := b.inBatches(ctx, len(keys), pageSize, func(ctx context.Context, lo, hi int) error {
		ids := make([]*qd.PointId, 0, hi-lo)
		for _, k := range keys[lo:hi] {
			ids = append(ids, markerID(k))
		}
		var found []*qd.RetrievedPoint
		err := b.call(ctx, func(ctx context.Context) error {
			resp, err := b.client.GetPointsClient().Get(ctx, &qd.GetPoints{
				CollectionName: b.cfg.Collection,
				Ids:            ids,
				WithPayload:    qd.NewWithPayload(true),
				WithVectors:    qd.NewWithVectors(false),
			})
			found = resp.GetResult()
			return err
		})
		if err != nil {
			return b.fail("get markers", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range found {
			m, err := decodeMarker(p.GetId(), p.GetPayload())
			if err != nil {
				return err
			}
			out[m.Key] = m
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetMarkers writes markers with a conditional upsert: Qdrant replaces a
// stored marker only if its version is lower than the new one, and inserts
// a marker where there is none. Of several markers for one key only the
// newest is sent.
func (b *Backend) SetMarkers(ctx context.Context, markers []index.Marker) error {
	if len(markers) == 0 {
		return nil
	}
	dim, err := b.vectorSize(ctx)
	if err != nil {
		return err
	}
	newest := make(map[string]int, len(markers))
	latest := make([]index.Marker, 0, len(markers))
	for _, m := range markers {
		i, seen := newest[m.Key]
		switch {
		case !seen:
			newest[m.Key] = len(latest)
			latest = append(latest, m)
		case m.Version > latest[i].Version:
			latest[i] = m
		}
	}
	return b.inBatches(ctx, len(latest), b.cfg.BatchSize, func(ctx context.Context, lo, hi int) error {
		points := make([]*qd.PointStruct, 0, hi-lo)
		older := make([]*qd.Condition, 0, hi-lo)
		for _, m := range latest[lo:hi] {
			points = append(points, markerPoint(m, dim))
			older = append(older, olderMarker(m))
		}
		err := b.call(ctx, func(ctx context.Context) error {
			_, err := b.client.GetPointsClient().Upsert(ctx, &qd.UpsertPoints{
				CollectionName: b.cfg.Collection,
				Wait:           qd.PtrOf(true),
				Points:         points,
				UpdateFilter:   &qd.Filter{Should: older},
			})
			return err
		})
		if err != nil {
			return b.fail("set markers", err)
		}
		return nil
	})
}

// ScanMarkers pages through every marker in id order. An error from fn
// stops the scan and is returned as is.
func (b *Backend) ScanMarkers(ctx context.Context, fn func(index.Marker) error) error {
	return b.scroll(ctx, "scan markers", onlyType(typeMarker), false, func(p *qd.RetrievedPoint) error {
		m, err := decodeMarker(p.GetId(), p.GetPayload())
		if err != nil {
			return err
		}
		return fn(m)
	})
}

// distinct returns keys without repeats, in first-seen order.
func distinct(keys []string) []string {
	seen := make(map[string]struct{}, len(keys))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}
