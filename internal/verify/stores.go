package verify

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/index"
)

// ReadOption tunes [ReadIndex].
type ReadOption func(*readConfig)

type readConfig struct {
	embedder embed.Embedder
	every    int
	seed     uint64
}

// CheckVectors has [ReadIndex] embed the chunks of one document in every
// (1: all of them; 0 or a nil e: none) again with e, the embedder of the
// store's vectors, and compare each with the stored vector: a vector that
// is not e's embedding of the point's text (cosine below
// [VectorAgreement]) gives the chunk the hash "vector-mismatch", so verify
// names the document and a repair embeds it again. Which documents are
// checked changes every hour, so that repeated runs cover them all; a run
// whose digests and documents are read on either side of an hour's turn
// may see a bucket differ with no document named (a digest mismatch,
// never agreement): run it again.
func CheckVectors(e embed.Embedder, every int) ReadOption {
	return func(c *readConfig) {
		c.embedder, c.every = e, every
		c.seed = uint64(time.Now().Unix() / 3600) //nolint:gosec // positive
	}
}

// VectorAgreement is the cosine above which a stored vector is taken for
// the embedding of its text: an embedder served remotely may differ in the
// last bits of a float from one call to the next.
const VectorAgreement = 0.999

// VectorMismatch is the hash [ReadIndex] gives a chunk whose stored vector
// is not its text's embedding.
const VectorMismatch = "vector-mismatch"

// checked reports whether the document of key is in this run's sample.
func (c *readConfig) checked(key string) bool {
	if c.embedder == nil || c.every <= 0 {
		return false
	}
	sum := sha256.Sum256([]byte(key))
	return (binary.BigEndian.Uint64(sum[:8])^c.seed)%uint64(c.every) == 0 //nolint:gosec // every > 0
}

// ReadIndex reads every document the index holds: its version marker and
// its points (in version, then ordinal order, so that points left over from
// another version show up as chunks that differ), each point's hash
// computed from what a search returns of it (see [IndexChunkHash]), not
// from the hashes its payload declares. Asked by [Handler] for a few
// buckets, it reads every marker and the points of those buckets'
// documents alone.
func ReadIndex(ctx context.Context, b interface {
	index.MarkerScanner
	Points(ctx context.Context, key string, withVectors bool) ([]index.Point, error)
}, opts ...ReadOption) ([]Doc, error) {
	var cfg readConfig
	for _, o := range opts {
		o(&cfg)
	}
	var markers []index.Marker
	if err := b.ScanMarkers(ctx, func(m index.Marker) error {
		if wanted(ctx, m.Key) {
			markers = append(markers, m)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	docs := make([]Doc, 0, len(markers))
	for _, m := range markers {
		check := cfg.checked(m.Key)
		pts, err := b.Points(ctx, m.Key, check)
		if err != nil {
			return nil, err
		}
		d := Doc{Key: m.Key, Version: m.Version, Deleted: m.Deleted, ContentHash: m.ContentHash}
		for _, p := range pts {
			d.Chunks = append(d.Chunks, Chunk{ID: p.ID, Hash: IndexChunkHash(p.Text, p.Title, p.Tags)})
		}
		if check && len(pts) > 0 {
			if err := cfg.checkVectors(ctx, pts, d.Chunks); err != nil {
				return nil, err
			}
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// checkVectors embeds the texts of pts again and marks in chunks those
// whose stored vector differs.
func (c *readConfig) checkVectors(ctx context.Context, pts []index.Point, chunks []Chunk) error {
	texts := make([]string, len(pts))
	for i, p := range pts {
		texts[i] = p.Text
	}
	vecs, err := c.embedder.Embed(ctx, texts)
	if err != nil {
		return fmt.Errorf("verify: embed %d chunks of %q again with %s: %w", len(texts), pts[0].Key, c.embedder.Name(), err)
	}
	if len(vecs) != len(texts) {
		return fmt.Errorf("verify: %s returned %d vectors for %d texts", c.embedder.Name(), len(vecs), len(texts))
	}
	for i, p := range pts {
		if cosine(p.Vector, vecs[i]) < VectorAgreement {
			chunks[i].Hash = VectorMismatch
		}
	}
	return nil
}

func cosine(a, b []float32) float64 {
	if len(a) != len(b) || len(a) == 0 {
		return 0
	}
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
}

// ReadGraph reads every document node of the graph, stubs excepted (a stub
// is a link target that was never written). Asked by [Handler] for a few
// buckets, it still scans every node and keeps those buckets' documents.
func ReadGraph(ctx context.Context, b graph.Backend) ([]Doc, error) {
	var docs []Doc
	err := b.ScanDocuments(ctx, func(v graph.View) error {
		if v.Stub || !wanted(ctx, v.Key) {
			return nil
		}
		d := Doc{Key: v.Key, Version: v.Version, Deleted: v.Deleted, ContentHash: v.ContentHash, Links: v.Links, Tags: v.Tags}
		if !v.Deleted {
			d.Title = v.Title
		}
		for _, c := range v.Chunks {
			d.Chunks = append(d.Chunks, Chunk{ID: c.ID, Hash: c.ContentHash})
		}
		docs = append(docs, d)
		return nil
	})
	return docs, err
}
