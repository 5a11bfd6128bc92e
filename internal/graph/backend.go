package graph

import (
	"context"

	"github.com/google/uuid"
)

// Doc is one document version as the graph holds it: the (:Document) node,
// its (:Chunk) nodes, and its outgoing LINKS_TO and TAGGED edges. A
// withdrawal is a Doc with Deleted set and no chunks, links or tags.
type Doc struct {
	Key         string
	Version     int64
	Deleted     bool
	Title       string
	ContentHash string
	Links       []string // keys of linked documents: sorted, distinct
	Tags        []string // sorted, distinct
	Chunks      []Chunk  // in ordinal order
	// Repair marks a write that repairs the document (a re-emitted event):
	// an equal stored version is written again, node, chunks and outgoing
	// edges, as if it were older. A newer stored version still wins. It is
	// an instruction to Apply, not part of what the graph holds: a View
	// never has it set.
	Repair bool
}

// Chunk is a (:Chunk) node.
type Chunk struct {
	ID          uuid.UUID // contract.ChunkID(key, version, ordinal)
	Ordinal     int
	ContentHash string // the chunk text's hash (contract.TextHash)
}

// View is what the graph holds about one key, read back: the document node
// (Stub when it exists only as the target of someone's link), its chunks,
// its outgoing links and tags, and the keys of the documents linking to it.
type View struct {
	Doc
	Stub     bool     // a node created by a link, never written by its own event
	LinkedBy []string // keys of documents with a LINKS_TO edge to this one: sorted
}

// Backend is a graph store: Neo4j, or the embedded graph. Every method is
// safe for concurrent use; calls for one document are never concurrent, but
// calls for different documents that link to each other may be.
type Backend interface {
	// Ensure creates what the store needs (uniqueness constraints on
	// Document.key, Chunk.id and Tag.name), idempotently.
	Ensure(ctx context.Context) error
	// Apply writes docs (distinct keys) with the freshness guard in the
	// store: a document whose stored version is greater than the incoming
	// one, or equal to it when the Doc is not a Repair, changes nothing
	// (applied[i] false). Otherwise the
	// node's fields are set, its chunks and outgoing LINKS_TO and TAGGED
	// edges are replaced by exactly the incoming ones (none remain from
	// older versions), a link to a key not yet seen creates a stub node,
	// and a withdrawal keeps the node (deleted, with its version) while
	// removing its chunks and outgoing edges; incoming links stay. A count
	// fence after the write checks that each applied document has exactly
	// its chunks, links and tags; a mismatch is an error naming the
	// numbers.
	Apply(ctx context.Context, docs []Doc) (applied []bool, err error)
	// Document reads what the graph holds about key; ok is false when
	// there is no node of that key at all.
	Document(ctx context.Context, key string) (v View, ok bool, err error)
	// ScanDocuments calls fn for every document node (stubs included), in
	// no particular order, until fn returns an error.
	ScanDocuments(ctx context.Context, fn func(View) error) error
	// Close releases the store.
	Close() error
}
