package wal

import (
	"errors"
	"log/slog"
	"time"
)

// DefaultCompactBytes is the log size that triggers a compaction when
// [Options.CompactBytes] is zero.
const DefaultCompactBytes = 64 << 20

// Options is a store's durability policy. The zero value is valid: every
// write call is durable before it returns and compaction runs at
// [DefaultCompactBytes].
type Options struct {
	// SyncEvery is how often appended records are forced to stable storage.
	// Zero syncs before every write call returns, so an acknowledged write
	// survives a crash. A positive interval syncs in the background at that
	// cadence: a crash can lose the writes of the last interval, and what
	// remains is always a prefix of the writes in their order.
	SyncEvery time.Duration
	// CompactBytes is how many log bytes, beyond the snapshot, trigger a
	// background compaction; the log must also have grown as large as the
	// snapshot, so the cost of rewriting it is amortised. Zero means
	// [DefaultCompactBytes]; negative disables automatic compaction (an
	// explicit Compact still works).
	CompactBytes int64
	// Logger receives the errors of background work (syncs when SyncEvery
	// is positive, compactions). Nil discards them.
	Logger *slog.Logger
}

// Validate reports options that cannot work.
func (o Options) Validate() error {
	if o.SyncEvery < 0 {
		return errors.New("wal: SyncEvery must not be negative")
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.CompactBytes == 0 {
		o.CompactBytes = DefaultCompactBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}
