package embedded

import (
	"fmt"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// ErrLocked is returned by [Open] when another process (or another [Store]
// in this one) has the directory open: the store has a single writer.
var ErrLocked = wal.ErrLocked

// ErrClosed is returned by every method of a closed [Store].
var ErrClosed = wal.ErrClosed

// ErrInvalidDocs is matched by the errors of [Store.Apply] for documents
// it cannot write: an empty key, a key twice in one call, a link to an
// empty key, or a withdrawal with chunks, links or tags. Like a
// [*FenceError] it is permanent: retrying the same documents cannot help.
var ErrInvalidDocs error = &permanentError{"embedded graph: invalid documents"}

// ErrCorrupt is matched by every [*CorruptError].
var ErrCorrupt = wal.ErrCorrupt

// CorruptError reports a damaged record in a log or snapshot file: one that
// fails its checksum or does not decode, and is not a torn final record.
// [Open] refuses such a directory rather than silently drop the records
// that follow; the graph can be rebuilt by replaying the stream.
type CorruptError = wal.CorruptError

// FenceError is the count fence failing: a document would be stored with
// other numbers of chunks, links or tags than it came with, because it
// repeats a chunk ID, a link or a tag, which the graph holds once. Nothing
// of the call is written.
type FenceError struct {
	Key     string
	Version int64
	// Stored are the numbers of chunks, links and tags the node would
	// hold; Incoming those of the document.
	Stored, Incoming [3]int
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("embedded graph: count fence: %q version %d would hold %d chunks, %d links, %d tags; the document has %d, %d, %d",
		e.Key, e.Version, e.Stored[0], e.Stored[1], e.Stored[2], e.Incoming[0], e.Incoming[1], e.Incoming[2])
}

// Permanent tells the projector runtime that retrying cannot help.
func (e *FenceError) Permanent() bool { return true }

type permanentError struct{ msg string }

func (e *permanentError) Error() string { return e.msg }

// Permanent tells the projector runtime that retrying cannot help.
func (e *permanentError) Permanent() bool { return true }
