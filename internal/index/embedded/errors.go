package embedded

import (
	"errors"
	"fmt"
)

// ErrLocked is returned by [Open] when another process (or another [Store]
// in this one) has the directory open: the store has a single writer.
var ErrLocked = errors.New("embedded index: directory is in use")

// ErrClosed is returned by every method of a closed [Store].
var ErrClosed = errors.New("embedded index: store is closed")

// ErrDimensionMismatch is returned when a vector or an [Store.Ensure] call
// disagrees with the dimension the store holds.
var ErrDimensionMismatch = errors.New("embedded index: dimension mismatch")

// ErrNoDimension is returned by writes of points before [Store.Ensure] has
// recorded a dimension.
var ErrNoDimension = errors.New("embedded index: no dimension recorded (Ensure not called)")

// ErrCorrupt is matched by every [*CorruptError].
var ErrCorrupt = errors.New("embedded index: corrupt file")

// CorruptError reports a damaged record in a log or snapshot file: one that
// fails its checksum or does not decode, and is not a torn final record.
// [Open] refuses such a directory rather than silently dropping the records
// that follow; the index can be rebuilt from the document store.
type CorruptError struct {
	Path   string // the file
	Offset int64  // the offset of the damaged record
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("embedded index: %s: corrupt record at offset %d: %s", e.Path, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }
