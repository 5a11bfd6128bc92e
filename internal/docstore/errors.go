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

// ErrNotReproducible is matched by every [*NotReproducibleError].
var ErrNotReproducible = errors.New("docstore: the stored document does not reproduce its event")

// NotReproducibleError is a document whose stored rows do not rebuild the
// event that was emitted for its version (its content hash differs, or its
// chunks are not those of the version). Re-emission refuses it rather than
// emit something other than the original.
type NotReproducibleError struct {
	Key     string
	Version int64
	Reason  string
}

func (e *NotReproducibleError) Error() string {
	return fmt.Sprintf("docstore: cannot re-emit %q version %d: %s", e.Key, e.Version, e.Reason)
}

// Is makes errors.Is(err, ErrNotReproducible) true.
func (e *NotReproducibleError) Is(target error) bool { return target == ErrNotReproducible }
