package deadletter

import (
	"fmt"
	"maps"
	"slices"
	"strings"
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
