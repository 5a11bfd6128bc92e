// Package embedded is the index store used when no Qdrant URL is
// configured: an [index.Backend] held in memory and made durable by an
// append-only log under one directory (under CONVERGE_DATA_DIR). Search is an
// exact scan: every point's cosine similarity to the query, a dot product
// of vectors stored normalised as float32, with the best k kept in a heap.
//
// # Files
//
// The directory's files, their records and their recovery are those of
// package [wal]:
//
//	LOCK                      flock'd by the one process that has the store open
//	embedder.json             the embedder that made the vectors (kind, model, dimension), replaced whole
//	snapshot                  the whole state as of some log (none before the first compaction)
//	wal-NNNNNNNNNNNNNNNN.log  the writes since, in order, one record per write call
//
// A payload is an op byte and its fields (codec.go): the dimension, an
// upsert of points, a delete of stale points, a set of markers. The
// snapshot's header holds the dimension and the point and marker counts,
// which its end record repeats.
//
// # Write order
//
// A write call (Ensure, SetMarkers, Upsert, DeleteStale, Retract) holds the lock
// while it appends its record to the log and then applies it in memory, so
// the log's order is the order readers observe. With [Options.SyncEvery]
// zero, Ensure and SetMarkers then sync the log up to everything appended
// so far (concurrent callers share one sync) before they return; Upsert
// and the deletes do not, since the index writes markers last and
// acknowledges an event only once SetMarkers returned: a crash before then
// loses points of events that are redelivered. With SyncEvery set, a
// background loop syncs at that interval.
// Guarded writes log only what they change: a marker not newer than the
// stored one, or a keep with nothing stale, writes nothing.
//
// A crash leaves a prefix of the records: at Open a torn final record (one
// cut short, or whose pages did not all reach the disk) is truncated away.
// A damaged record anywhere else is a [*CorruptError] naming the file and
// offset, and Open fails rather than drop the records after it; the index
// is derived data and can be rebuilt from the document store.
//
// Compaction (see [wal.Log.Compact]) starts the next log, writes the state
// captured at that moment to snapshot.tmp, syncs it, renames it to
// snapshot, syncs the directory and only then removes the logs it covers.
// A crash at any step leaves either the old snapshot with every log, or
// the new snapshot with logs it covers, which Open deletes. Writes
// continue during a compaction: points are immutable once stored, so the
// snapshot is written from a copied slice of pointers without holding the
// lock.
//
// # Why not chromem-go
//
// github.com/philippgille/chromem-go (v0.7.0) was considered and rejected:
//
//   - Durability: it writes one gob file per document, truncating the file
//     in place (os.Create) with no fsync and no rename, so a crash can leave
//     an empty or partial file, after which opening the database fails.
//   - Correctness: a document's file name is the first 4 bytes of the
//     SHA-256 of its ID, so IDs collide on disk; 100,000 random chunk IDs
//     gave 2 collisions, and the database reopened with 2 points missing.
//   - Semantics: metadata is map[string]string (tags, version and ordinal
//     would be strings to re-parse), there is no per-key count or listing
//     by key, deletion filters only by equality (DeleteStale needs "key =
//     K and version < V"), queries ask for no more results than the
//     collection holds and do not break ties, and nothing stops a second
//     process from opening the same directory.
//   - Speed: 7,500 points/s for 100,000 points of dimension 256 without
//     any fsync (1,300 points/s with compression), 120 ms per top-10 query
//     over them, 8.5 s to reopen (2 cores).
//
// On the same 2-core machine this package writes 100,000 new points of
// dimension 256 at about 84,000 points/s with an fsync per write call of
// 1,000 points, answers a top-10 query over them in about 14 ms (the scan
// reads 100 MB of vectors, so it is bound by memory bandwidth), reopens
// from a snapshot in under 0.2 s, and keeps the guard semantics of
// [index.Backend] exactly.
package embedded
