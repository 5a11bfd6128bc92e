package embedded

import (
	"errors"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// ErrLocked is returned by [Open] when another process (or another [Store]
// in this one) has the directory open: the store has a single writer.
var ErrLocked = wal.ErrLocked

// ErrClosed is returned by every method of a closed [Store].
var ErrClosed = wal.ErrClosed

// ErrDimensionMismatch is returned when a vector or an [Store.Ensure] call
// disagrees with the dimension the store holds.
var ErrDimensionMismatch = errors.New("embedded index: dimension mismatch")

// ErrNoDimension is returned by writes of points before [Store.Ensure] has
// recorded a dimension.
var ErrNoDimension = errors.New("embedded index: no dimension recorded (Ensure not called)")

// ErrCorrupt is matched by every [*CorruptError].
var ErrCorrupt = wal.ErrCorrupt

// CorruptError reports a damaged record in a log or snapshot file: one that
// fails its checksum or does not decode, and is not a torn final record.
// [Open] refuses such a directory rather than silently dropping the records
// that follow; the index can be rebuilt from the document store.
type CorruptError = wal.CorruptError
