package embedded

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// snapshotBatch is how many nodes a snapshot record holds.
const snapshotBatch = 256

// Compact writes the graph to a new snapshot and removes the logs it
// covers. It runs in the background on its own when the log has grown
// (see [Options.CompactBytes]); writes go on while it runs.
func (s *Store) Compact(ctx context.Context) error { return s.log.Compact(ctx) }

// durable is the Store as its log sees it ([wal.State]): the lock over its
// state, the capture of a snapshot, and the replay at Open, which checks
// the snapshot's node count at its end.
type durable struct {
	s      *Store
	nodes  uint64 // the snapshot's count
	loaded uint64 // nodes read from it
}

func (d *durable) Lock()   { d.s.mu.Lock() }
func (d *durable) Unlock() { d.s.mu.Unlock() }

// Capture is the snapshot of the graph, taken with mu held by the log's
// compaction: a copied slice of the nodes (never modified once stored),
// stubs included, written without the lock. Incoming links are not
// written: they follow from the nodes' links.
func (d *durable) Capture() (wal.Snapshot, error) {
	nodes := make([]*node, 0, len(d.s.nodes))
	for _, n := range d.s.nodes {
		nodes = append(nodes, n)
	}
	count := binary.AppendUvarint(nil, uint64(len(nodes)))
	return wal.Snapshot{Header: count, End: count, Write: func(w *wal.SnapshotWriter) error {
		var buf []byte // one for every record, as the index's snapshot does
		for batch := range slices.Chunk(nodes, snapshotBatch) {
			rec, err := encodeNodesInto(buf, opNodes, batch)
			if err != nil {
				return err
			}
			if err := w.Write(rec); err != nil {
				return err
			}
			buf = rec
		}
		return nil
	}}, nil
}

func decodeCount(fields []byte) (uint64, error) {
	d := wal.NewDecoder(fields)
	n := d.Uvarint()
	return n, d.Finish()
}

func (d *durable) SnapshotHeader(fields []byte) (err error) {
	d.nodes, err = decodeCount(fields)
	return err
}

// SnapshotRecord stores the nodes as they are. A node linking to one later
// in the snapshot creates a stub for it, which that node then replaces.
func (d *durable) SnapshotRecord(payload []byte) error {
	n, err := d.load(payload, opNodes, func(n *node) error {
		if old := d.s.nodes[n.key]; old != nil && !old.stub {
			return fmt.Errorf("node %q twice in the snapshot", n.key)
		}
		return nil
	})
	d.loaded += uint64(n)
	return err
}

// SnapshotEnd checks the counts: a link target missing from the snapshot
// would have been created as a stub, and counted in the nodes held.
func (d *durable) SnapshotEnd(fields []byte) error {
	end, err := decodeCount(fields)
	if err != nil {
		return err
	}
	if end != d.nodes || d.loaded != d.nodes || uint64(len(d.s.nodes)) != d.nodes {
		return fmt.Errorf("counts disagree: header %d nodes, end %d, read %d, held %d", d.nodes, end, d.loaded, len(d.s.nodes))
	}
	return nil
}

// LogRecord applies the documents of one Apply call, which passed the
// freshness guard when they were written.
func (d *durable) LogRecord(payload []byte) error {
	_, err := d.load(payload, opApply, func(*node) error { return nil })
	return err
}

// load stores the nodes of a record of op that accept lets through, and
// returns how many it stored.
func (d *durable) load(payload []byte, op byte, accept func(*node) error) (int, error) {
	nodes, err := decodeNodes(payload, op)
	if err != nil {
		return 0, err
	}
	for i, n := range nodes {
		if err := accept(n); err != nil {
			return i, err
		}
		d.s.put(packNode(n))
	}
	return len(nodes), nil
}
