package index

import (
	"context"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/embed"
)

// Point is one chunk of one document version in an index store.
type Point struct {
	ID          uuid.UUID // contract.ChunkID(Key, Version, Ordinal)
	Key         string    // the document's key
	Version     int64     // the document version the chunk belongs to
	Ordinal     int       // the chunk's position in the document
	ContentHash string    // the document version's content hash
	ChunkHash   string    // the chunk text's hash (contract.TextHash)
	Title       string    // the document's title
	Tags        []string  // the document's tags
	Text        string    // the chunk's text
	Vector      []float32 // nil when read back without vectors
}

// Marker is a document's version marker, kept in the index store itself so
// that the freshness guard survives restarts and rebuilds. A withdrawn
// document keeps its marker (Deleted, with the withdrawal's version), so a
// late older upsert cannot resurrect it.
type Marker struct {
	Key         string
	Version     int64
	Deleted     bool
	ContentHash string
}

// Hit is a search result: a chunk and its cosine similarity to the query.
type Hit struct {
	Point Point // without its vector
	Score float32
}

// Keep names a document and one of its versions: [Writer.DeleteStale]
// removes the document's points older than Version (Version 0: all of
// them), [Writer.Retract] the points of exactly Version.
type Keep struct {
	Key     string
	Version int64
}

// Writer is what an [Index] writes with, in its write order: the
// store's preparation, the version markers, the points.
type Writer interface {
	// Ensure prepares the store for vectors of dim dimensions with cosine
	// distance (a Qdrant collection and payload indexes on key and
	// version). It is idempotent; an existing store of another dimension is
	// an error that names both dimensions.
	Ensure(ctx context.Context, dim int) error
	// Markers returns the stored markers of the keys that have one.
	Markers(ctx context.Context, keys []string) (map[string]Marker, error)
	// SetMarkers stores markers. A stored marker with a version greater
	// than or equal to the new one is left alone (a conditional write where
	// the store supports it, so the guard also holds at the store). When
	// it returns, the writes of the Upsert and DeleteStale calls before it
	// are durable too (the embedded index syncs them with the markers).
	SetMarkers(ctx context.Context, markers []Marker) error
	// Upsert writes points; a point whose ID exists is replaced. It may be
	// durable only once a later SetMarkers returns.
	Upsert(ctx context.Context, points []Point) error
	// DeleteStale removes, for each Keep, the document's points whose
	// version is lower than Keep.Version (all of them when it is 0). It
	// never removes a newer version's points, so a writer that resumes
	// late with an older version cannot delete what a newer one wrote.
	DeleteStale(ctx context.Context, keep []Keep) error
	// Retract removes, for each Keep, the document's points of exactly
	// Keep.Version: the points a writer wrote for a version that, as the
	// markers then showed, a newer one had already superseded.
	Retract(ctx context.Context, keep []Keep) error
	// RecordEmbedder records the identity of the embedder that makes the
	// store's vectors, replacing any recorded before; after Ensure.
	RecordEmbedder(ctx context.Context, id embed.Identity) error
}

// Reader reads points back: an [Index]'s count fence, the vectors it
// reuses, and its searches.
type Reader interface {
	// Counts returns how many points each key has, over all versions (keys
	// without points map to 0).
	Counts(ctx context.Context, keys []string) (map[string]int, error)
	// Points returns the document's points, ordered by version then
	// ordinal; withVectors false leaves Vector nil.
	Points(ctx context.Context, key string, withVectors bool) ([]Point, error)
	// Search returns the k chunks nearest to vector by cosine similarity,
	// best first (ties broken by point ID for determinism).
	Search(ctx context.Context, vector []float32, k int) ([]Hit, error)
	// Embedder returns the identity RecordEmbedder recorded, and false
	// when there is none: a store not created yet, or one made before
	// identities were recorded.
	Embedder(ctx context.Context) (embed.Identity, bool, error)
}

// MarkerScanner reads every version marker: verify's side of the index.
type MarkerScanner interface {
	// ScanMarkers calls fn for every stored marker, in no particular order,
	// until fn returns an error.
	ScanMarkers(ctx context.Context, fn func(Marker) error) error
}

// ReadWriter is what an [Index] needs of its store.
type ReadWriter interface {
	Writer
	Reader
}

// Backend is the storage under an [Index]: a Qdrant collection or the
// embedded index, with every role and Close; what an implementation
// provides and the conformance suite (internal/index/indextest) checks.
// It knows nothing of events or embedders; the Index owns the write order
// and the freshness rules. Every method is safe for concurrent use; calls
// for one document are never concurrent.
type Backend interface {
	Writer
	Reader
	MarkerScanner
	// Close releases the store (the embedded index flushes and closes its
	// files).
	Close() error
}
