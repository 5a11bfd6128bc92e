package embedded

import "github.com/converge-sync/converge/internal/storage/wal"

// DefaultCompactBytes is the log size that triggers a compaction when
// [Options.CompactBytes] is zero.
const DefaultCompactBytes = wal.DefaultCompactBytes

// Options configures a [Store]: when its writes reach stable storage and
// when its log is compacted (see [wal.Options]). The zero value is valid:
// every Apply is durable before it returns and compaction runs at
// [DefaultCompactBytes].
type Options = wal.Options
