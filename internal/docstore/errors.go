package docstore

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned by [Store.Get] for a key never written.
var ErrNotFound = errors.New("docstore: document not found")

// ErrVersionConflict is matched by every [*ConflictError].
var ErrVersionConflict = errors.New("docstore: version conflict")

// ConflictError is the producer error of writing the same (key, version)
// twice with different content. It is never resolved by overwriting.
type ConflictError struct {
	Key           string
	Version       int64
	StoredHash    string
	IncomingHash  string
	StoredDeleted bool
}

func (e *ConflictError) Error() string {
	what := "different content"
	if e.StoredDeleted {
		what = "a withdrawal"
	}
	return fmt.Sprintf("docstore: version %d of %q is already stored with %s (stored hash %.12s, incoming %.12s)",
		e.Version, e.Key, what, e.StoredHash, e.IncomingHash)
}

// Is makes errors.Is(err, ErrVersionConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrVersionConflict }
