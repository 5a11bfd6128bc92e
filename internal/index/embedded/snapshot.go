package embedded

import (
	"context"
	"fmt"
	"iter"
	"slices"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal"
)

// Records of a snapshot hold this many points or markers each.
const (
	snapshotPointBatch  = 256
	snapshotMarkerBatch = 4096
)

// Compact writes the store's content to a new snapshot and removes the logs
// it covers. It runs in the background on its own when the log has grown
// (see [Options.CompactBytes]); writes go on while it runs.
func (s *Store) Compact(ctx context.Context) error { return s.log.Compact(ctx) }

// durable is the Store as its log sees it ([wal.State]): the lock over its
// state, the capture of a snapshot, and the replay at Open, which checks
// the snapshot's counts at its end.
type durable struct {
	s               *Store
	head            snapshotCounts
	points, markers uint64 // read from the snapshot
}

func (r *durable) Lock()   { r.s.mu.Lock() }
func (r *durable) Unlock() { r.s.mu.Unlock() }

// Capture is the snapshot of the state, taken with mu held by the log's
// compaction: the markers copied, the points a copied slice of pointers
// (points are never modified once stored), written without the lock. The
// points go key by key, so that a document's points are read back next to
// each other and packed together again (see pack); the order of all is not
// the documents', once removals have moved points into freed places.
func (r *durable) Capture() (wal.Snapshot, error) {
	s := r.s
	points := make([]*index.Point, 0, len(s.all))
	for _, ps := range s.byKey {
		points = append(points, ps...)
	}
	markers := make([]index.Marker, 0, len(s.markers))
	for _, m := range s.markers {
		markers = append(markers, m)
	}
	counts := snapshotCounts{dim: s.dim, nPoints: uint64(len(points)), nMarkers: uint64(len(markers))}
	return wal.Snapshot{
		Header: counts.appendHeader(nil),
		End:    counts.appendEnd(nil),
		Write: func(w *wal.SnapshotWriter) error {
			put := func(rec []byte, err error) error {
				if err != nil {
					return err
				}
				return w.Write(rec)
			}
			for batch := range slices.Chunk(markers, snapshotMarkerBatch) {
				if err := put(encodeMarkers(batch)); err != nil {
					return err
				}
			}
			// One buffer for every record of points: the snapshot's size
			// is the index's, and allocating it anew would drive the
			// garbage collector (and so every goroutine's assists) for as
			// long as the compaction runs.
			var buf []byte
			for batch := range byDocument(points, snapshotPointBatch) {
				rec, err := encodeUpsertInto(buf, batch)
				if err := put(rec, err); err != nil {
					return err
				}
				buf = rec
			}
			return nil
		},
	}, nil
}

func (r *durable) SnapshotHeader(fields []byte) error {
	head, err := decodeSnapshotHeader(fields)
	if err != nil {
		return err
	}
	r.head = head
	r.s.dim = head.dim
	return nil
}

func (r *durable) SnapshotRecord(payload []byte) error {
	rec, err := decodeRecord(payload)
	if err != nil {
		return err
	}
	switch rec.op {
	case opMarkers:
		r.s.applyMarkers(rec.markers)
		r.markers += uint64(len(rec.markers))
	case opUpsert:
		if err := r.s.checkDims(rec.points); err != nil {
			return err
		}
		r.s.applyReadBack(rec.points)
		r.points += uint64(len(rec.points))
	default:
		return fmt.Errorf("unexpected op %d in a snapshot", rec.op)
	}
	return nil
}

func (r *durable) SnapshotEnd(fields []byte) error {
	end, err := decodeSnapshotEnd(fields)
	if err != nil {
		return err
	}
	s, head := r.s, r.head
	if end.nPoints != head.nPoints || end.nMarkers != head.nMarkers ||
		r.points != head.nPoints || r.markers != head.nMarkers ||
		uint64(len(s.all)) != r.points || uint64(len(s.markers)) != r.markers {
		return fmt.Errorf("counts disagree: header %d points %d markers, end %d/%d, read %d/%d, distinct %d/%d",
			head.nPoints, head.nMarkers, end.nPoints, end.nMarkers, r.points, r.markers, len(s.all), len(s.markers))
	}
	return nil
}

func (r *durable) LogRecord(payload []byte) error {
	rec, err := decodeRecord(payload)
	if err != nil {
		return err
	}
	return r.s.replay(rec)
}

// byDocument cuts points, in which each document's points are next to each
// other, into runs of n points or a few more, never splitting a document:
// a record is read back and packed a document at a time, so a document cut
// in two would come back as two groups.
func byDocument(points []*index.Point, n int) iter.Seq[[]*index.Point] {
	return func(yield func([]*index.Point) bool) {
		for len(points) > 0 {
			end := min(n, len(points))
			for end < len(points) && points[end].Key == points[end-1].Key {
				end++
			}
			if !yield(points[:end]) {
				return
			}
			points = points[end:]
		}
	}
}
