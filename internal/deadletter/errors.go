package deadletter

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/converge-sync/converge/pkg/contract"
)

// UnknownConsumerError is the error for a consumer without dead letters.
type UnknownConsumerError struct {
	Consumer string
	// Known are the consumers that have dead letters, sorted.
	Known []string
}

func newUnknownConsumer(consumer string, counts map[string]uint64) *UnknownConsumerError {
	return &UnknownConsumerError{Consumer: consumer, Known: slices.Sorted(maps.Keys(counts))}
}

func (e *UnknownConsumerError) Error() string {
	if len(e.Known) == 0 {
		return fmt.Sprintf("no dead letters for consumer %q: no consumer has any", e.Consumer)
	}
	return fmt.Sprintf("no dead letters for consumer %q; consumers with dead letters: %s", e.Consumer, strings.Join(e.Known, ", "))
}

// ErrNotReproducible is matched by the error of a [Reemitter] that refused
// a request because a document's stored rows do not reproduce the event
// that was emitted for it; nothing of that request was re-emitted.
var ErrNotReproducible = errors.New("deadletter: the writer cannot reproduce the document's event")

// ErrNoReemitter is the error of a redrive of document dead letters
// without a [Reemitter].
var ErrNoReemitter = errors.New("deadletter: the dead letters of " + contract.DocsStream + " are redriven through the writer, and none was given")
