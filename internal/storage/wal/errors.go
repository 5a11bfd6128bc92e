package wal

import (
	"errors"
	"fmt"
)

// ErrLocked is returned by [Open] when another process (or another [Log]
// in this one) has the directory open: a directory has a single writer.
var ErrLocked = errors.New("wal: directory is in use")

// ErrClosed is returned by the methods of a closed [Log], and by the
// stores on it once they are closed.
var ErrClosed = errors.New("wal: store is closed")

// ErrTorn is returned by [Reader.Next] for a final record that a crash cut
// short: the file should be truncated at the record's offset.
var ErrTorn = errors.New("wal: torn record")

// ErrCorrupt is matched by every [*CorruptError].
var ErrCorrupt = errors.New("wal: corrupt file")

// CorruptError reports a damaged record in a log or snapshot file: one that
// fails its checksum or does not decode, and is not a torn final record.
// [Open] refuses such a directory rather than silently drop the records
// that follow.
type CorruptError struct {
	Path   string // the file
	Offset int64  // the offset of the damaged record
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("wal: %s: corrupt record at offset %d: %s", e.Path, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }
