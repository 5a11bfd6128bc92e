package verify

import (
	"context"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/index"
)

// ReadIndex reads every document the index holds: its version marker and
// its points (in version, then ordinal order, so that points left over from
// another version show up as chunks that differ).
func ReadIndex(ctx context.Context, b interface {
	index.MarkerScanner
	Points(ctx context.Context, key string, withVectors bool) ([]index.Point, error)
}) ([]Doc, error) {
	var markers []index.Marker
	if err := b.ScanMarkers(ctx, func(m index.Marker) error {
		markers = append(markers, m)
		return nil
	}); err != nil {
		return nil, err
	}
	docs := make([]Doc, 0, len(markers))
	for _, m := range markers {
		pts, err := b.Points(ctx, m.Key, false)
		if err != nil {
			return nil, err
		}
		d := Doc{Key: m.Key, Version: m.Version, Deleted: m.Deleted, ContentHash: m.ContentHash}
		for _, p := range pts {
			d.Chunks = append(d.Chunks, Chunk{ID: p.ID, Hash: p.ChunkHash})
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// ReadGraph reads every document node of the graph, stubs excepted (a stub
// is a link target that was never written).
func ReadGraph(ctx context.Context, b graph.Backend) ([]Doc, error) {
	var docs []Doc
	err := b.ScanDocuments(ctx, func(v graph.View) error {
		if v.Stub {
			return nil
		}
		d := Doc{Key: v.Key, Version: v.Version, Deleted: v.Deleted, ContentHash: v.ContentHash, Links: v.Links, Tags: v.Tags}
		for _, c := range v.Chunks {
			d.Chunks = append(d.Chunks, Chunk{ID: c.ID, Hash: c.ContentHash})
		}
		docs = append(docs, d)
		return nil
	})
	return docs, err
}
