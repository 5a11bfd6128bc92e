package verify

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Position is a position in Postgres's write-ahead log (an LSN): where
// Postgres was when verify read a side of it. Every transaction a read
// saw wrote its commit record before the position the read returns.
type Position uint64

// ParseLSN reads Postgres's text form of an LSN, "16/B374D848".
func ParseLSN(s string) (Position, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("verify: LSN %q: want X/Y", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("verify: LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("verify: LSN %q: %w", s, err)
	}
	return Position(h<<32 | l), nil
}

// String is Postgres's text form of the LSN.
func (p Position) String() string { return fmt.Sprintf("%X/%X", uint64(p)>>32, uint32(p)) }

// PositionedTruth is Postgres read at a known position: what [Watcher]
// compares the stores with.
type PositionedTruth interface {
	Name() string
	// DigestsAt returns the digests of buckets (of n) alone, read in one
	// snapshot, and the position after it.
	DigestsAt(ctx context.Context, kind Kind, n int, buckets []int) (map[int]BucketDigest, Position, error)
	// BucketsAt returns the documents of buckets (of n), read in one
	// snapshot, and the position after it.
	BucketsAt(ctx context.Context, kind Kind, n int, buckets []int) (map[int][]Doc, Position, error)
}

// Progress tells how far a store's projection has come.
type Progress interface {
	// Passed reports whether the projection of store has dealt with (applied,
	// found stale, or dead-lettered) every event of every transaction whose
	// commit record is before p.
	Passed(ctx context.Context, store string, p Position) (bool, error)
}
