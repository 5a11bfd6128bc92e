package qdrant

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/index"
)

// Upsert writes points in batches of BatchSize, Parallel batches at a time.
// A failed batch fails the call; batches already written stay written,
// which a repeated call makes whole again (same ids, same payloads).
//
// Every vector's size is checked before anything is sent: Qdrant refuses a
// wrong-size vector only as it applies that point, after writing the
// points it applied before it (lib/shard/src/update/points/upsert.rs), and
// a repeated call cannot make such a batch whole. A wrong size is a
// [*PointDimensionError] and writes nothing.
func (b *Backend) Upsert(ctx context.Context, points []index.Point) error {
	if len(points) == 0 {
		return nil
	}
	dim, err := b.vectorSize(ctx)
	if err != nil {
		return err
	}
	for _, p := range points {
		if len(p.Vector) != dim {
			return &PointDimensionError{Collection: b.cfg.Collection, Point: p.ID, Have: len(p.Vector), Want: dim}
		}
	}
	return b.inBatches(ctx, len(points), b.cfg.BatchSize, func(ctx context.Context, lo, hi int) error {
		batch := make([]*qd.PointStruct, 0, hi-lo)
		for _, p := range points[lo:hi] {
			batch = append(batch, chunkPoint(p))
		}
		err := b.call(ctx, func(ctx context.Context) error {
			_, err := b.client.GetPointsClient().Upsert(ctx, &qd.UpsertPoints{
				CollectionName: b.cfg.Collection,
				Wait:           qd.PtrOf(true),
				Points:         batch,
			})
			return err
		})
		if err != nil {
			return b.fail("upsert", err)
		}
		return nil
	})
}

// DeleteStale deletes by filter, one request per BatchSize keeps (each keep
// one should clause), the points of each key older than its kept version:
// a writer that resumes late with an older version cannot delete a newer
// one's points. Markers are never deleted.
func (b *Backend) DeleteStale(ctx context.Context, keep []index.Keep) error {
	return b.deleteChunks(ctx, "delete stale", keep, staleChunks)
}

// Retract deletes by filter the points of exactly each keep's version.
func (b *Backend) Retract(ctx context.Context, keep []index.Keep) error {
	return b.deleteChunks(ctx, "retract", keep, versionChunks)
}

// deleteChunks deletes the points selected by one filter per keep, one
// request per BatchSize keeps.
func (b *Backend) deleteChunks(ctx context.Context, op string, keep []index.Keep, selected func(index.Keep) *qd.Filter) error {
	return b.inBatches(ctx, len(keep), b.cfg.BatchSize, func(ctx context.Context, lo, hi int) error {
		conds := make([]*qd.Condition, 0, hi-lo)
		for _, k := range keep[lo:hi] {
			conds = append(conds, qd.NewFilterAsCondition(selected(k)))
		}
		return b.deletePoints(ctx, op, qd.NewPointsSelectorFilter(&qd.Filter{Should: conds}))
	})
}

// deletePoints deletes the points sel selects, waiting for the write.
func (b *Backend) deletePoints(ctx context.Context, op string, sel *qd.PointsSelector) error {
	err := b.call(ctx, func(ctx context.Context) error {
		_, err := b.client.GetPointsClient().Delete(ctx, &qd.DeletePoints{
			CollectionName: b.cfg.Collection,
			Wait:           qd.PtrOf(true),
			Points:         sel,
		})
		return err
	})
	if err != nil {
		return b.fail(op, err)
	}
	return nil
}

// Counts counts each key's chunk points from one scroll of their ids
// (payload: the key only) per countKeys keys, Parallel at a time, instead
// of one Count request per key: the count fence of a shard of 128
// documents was 128 requests. The single writer makes the pages
// consistent.
func (b *Backend) Counts(ctx context.Context, keys []string) (map[string]int, error) {
	keys = distinct(keys)
	out := make(map[string]int, len(keys))
	for _, k := range keys {
		out[k] = 0
	}
	var mu sync.Mutex
	err := b.inBatches(ctx, len(keys), countKeys, func(ctx context.Context, lo, hi int) error {
		filter := &qd.Filter{Must: []*qd.Condition{
			qd.NewMatchKeywords(fieldKey, keys[lo:hi]...),
			qd.NewMatchKeyword(fieldType, typeChunk),
		}}
		counted := make(map[string]int, hi-lo)
		err := b.scrollSelect(ctx, "count", filter, qd.NewWithPayloadInclude(fieldKey), false, pageSize, func(p *qd.RetrievedPoint) error {
			counted[p.GetPayload()[fieldKey].GetStringValue()]++
			return nil
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for k, n := range counted {
			if _, asked := out[k]; !asked {
				return b.fail("count", fmt.Errorf("a point of key %q answered a count of other keys", k))
			}
			out[k] += n
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// countKeys is how many keys one counting scroll asks for: with a few
// chunks a document, its points fit in one or two pages.
const countKeys = 64

// Points scrolls through the document's chunks and orders them by version,
// then ordinal.
func (b *Backend) Points(ctx context.Context, key string, withVectors bool) ([]index.Point, error) {
	var out []index.Point
	err := b.scroll(ctx, "scroll points", chunksOf(key), withVectors, func(r *qd.RetrievedPoint) error {
		var vectors *qd.VectorsOutput
		if withVectors {
			vectors = r.GetVectors()
		}
		p, err := decodeChunk(r.GetId(), r.GetPayload(), vectors)
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b index.Point) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), cmp.Compare(a.Ordinal, b.Ordinal), bytes.Compare(a.ID[:], b.ID[:]))
	})
	return out, nil
}

// scroll pages through the points filter matches, in id order, calling fn
// for each; an error from fn stops it and is returned as is.
func (b *Backend) scroll(ctx context.Context, op string, filter *qd.Filter, withVectors bool, fn func(*qd.RetrievedPoint) error) error {
	return b.scrollSelect(ctx, op, filter, qd.NewWithPayload(true), withVectors, pageSize, fn)
}

// scrollSelect is scroll with the payload fields and the page size given.
func (b *Backend) scrollSelect(ctx context.Context, op string, filter *qd.Filter, payload *qd.WithPayloadSelector, withVectors bool, limit uint32,
	fn func(*qd.RetrievedPoint) error) error {
	var offset *qd.PointId
	for {
		var page []*qd.RetrievedPoint
		var next *qd.PointId
		err := b.call(ctx, func(ctx context.Context) error {
			resp, err := b.client.GetPointsClient().Scroll(ctx, &qd.ScrollPoints{
				CollectionName: b.cfg.Collection,
				Filter:         filter,
				Offset:         offset,
				Limit:          qd.PtrOf(limit),
				WithPayload:    payload,
				WithVectors:    qd.NewWithVectors(withVectors),
			})
			page, next = resp.GetResult(), resp.GetNextPageOffset()
			return err
		})
		if err != nil {
			return b.fail(op, err)
		}
		for _, p := range page {
			if err := fn(p); err != nil {
				return err
			}
		}
		if next == nil {
			return nil
		}
		offset = next
	}
}

// ScanKeys calls fn with the key of every document the collection holds
// anything of: a marker, or chunk points (a first write stopped before
// its marker leaves points without one), in no particular order; a key
// may come more than once. An error from fn stops the scan and is
// returned as is.
func (b *Backend) ScanKeys(ctx context.Context, fn func(key string) error) error {
	keyOf := func(p *qd.RetrievedPoint) error { return fn(p.GetPayload()[fieldKey].GetStringValue()) }
	if err := b.scrollSelect(ctx, "scan keys", onlyType(typeMarker), qd.NewWithPayloadInclude(fieldKey), false, keysPageSize, keyOf); err != nil {
		return err
	}
	return b.scrollSelect(ctx, "scan keys", onlyType(typeChunk), qd.NewWithPayloadInclude(fieldKey), false, keysPageSize, keyOf)
}

// keysPageSize is ScanKeys' page: the key alone of each point.
const keysPageSize = 4096

// WipeDocuments deletes every point of the documents called keys, their
// markers included, as if no event of theirs had been applied, for a
// rebuild of their partition; the collection's other documents keep
// theirs. BatchSize keys per pair of requests: their chunk points first,
// then their markers.
func (b *Backend) WipeDocuments(ctx context.Context, keys []string) error {
	keys = distinct(keys)
	return b.inBatches(ctx, len(keys), b.cfg.BatchSize, func(ctx context.Context, lo, hi int) error {
		batch := keys[lo:hi]
		ids := make([]*qd.PointId, 0, len(batch))
		for _, k := range batch {
			ids = append(ids, markerID(k))
		}
		chunks := &qd.Filter{Must: []*qd.Condition{qd.NewMatchKeywords(fieldKey, batch...), qd.NewMatchKeyword(fieldType, typeChunk)}}
		if err := b.deletePoints(ctx, "wipe documents", qd.NewPointsSelectorFilter(chunks)); err != nil {
			return err
		}
		return b.deletePoints(ctx, "wipe documents", qd.NewPointsSelector(ids...))
	})
}
