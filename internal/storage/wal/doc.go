// Package wal makes a store's in-memory state durable: an append-only log
// of checksummed records under one directory, compacted now and then into
// a snapshot. The embedded index and the embedded graph keep their state
// in memory and write through a [Log]; what their records hold is theirs,
// the files, their order and their recovery are this package's.
//
// # Files
//
//	LOCK                      flock'd by the one process that has the directory open
//	snapshot                  the whole state as of some log (none before the first compaction)
//	wal-NNNNNNNNNNNNNNNN.log  the records since, in order
//
// A record is a length, a checksum of the length, a CRC-32C of the payload
// and the payload (record.go). A log starts with a header record naming
// its [Format] and sequence number; the snapshot starts with a header
// naming its Format and the first log it does not cover, and ends with an
// end record, both carrying fields of the store's own ([Snapshot]).
//
// # Write order
//
// A store holds its state lock ([State]) while it appends a record
// ([Log.Append]) and then applies it in memory, so the log's order is the
// order readers observe. With [Options.SyncEvery] zero it then calls
// [Log.Commit] without the lock, which syncs the log (concurrent callers
// share one sync) before it returns; otherwise a background loop syncs at
// that interval. A failed write or sync makes every later append fail
// until the directory is opened again: after a failed fsync nothing
// written since the last good one can be trusted.
//
// A crash leaves a prefix of the records: at [Open] a torn final record
// (one cut short, or whose pages did not all reach the disk) is truncated
// away. A damaged record anywhere else is a [*CorruptError] naming the
// file and offset, and Open fails rather than drop the records after it.
//
// Compaction (snapshot.go) syncs the log, starts the next one and captures
// the state ([State.Capture]) under the state lock, then without it
// writes the snapshot to snapshot.tmp, syncs it, renames it to snapshot,
// syncs the directory and only then removes the logs it covers. A crash at
// any step leaves either the old snapshot with every log, or the new
// snapshot with logs it covers, which Open deletes, together with an
// unfinished snapshot.tmp.
package wal
