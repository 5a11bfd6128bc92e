// Package embedded is the graph store used when no Neo4j URL is
// configured: a [graph.Backend] held in memory and made durable by an
// append-only log under one directory (DataDir/graph), through package
// [wal].
//
// # State
//
// Per key the store holds a node: a written document (key, version,
// deleted, title, content hash), its chunks, its outgoing links and its
// tags; or a stub, a key that documents link to but that has not been
// written. In memory beside the nodes is a reverse index, for each key the
// sorted keys of the documents linking to it ([graph.View.LinkedBy]),
// updated whenever a document's links are replaced or withdrawn; it is
// derived from the nodes and not stored.
//
// A link to a key with no node creates a stub, which the key's first
// upsert fills in whatever its version. A stub stays when its last
// incoming link goes away, as the stub node would in Neo4j: stubs are
// never removed. A withdrawal keeps its node as a tombstone (deleted, with
// its version) and drops its chunks, links and tags; links from other
// documents to it stay.
//
// # Writes
//
// [Store.Apply] first builds, without the lock, the node each document
// would be stored as (links and tags sorted and distinct, chunks by
// ordinal with distinct IDs) and applies the count fence to it: a
// document whose numbers of chunks, links or tags differ from the node's
// (it repeats one) fails the call with a [*FenceError] and nothing is
// written. Invalid documents fail it with [ErrInvalidDocs]. Both are
// permanent errors for the projector runtime. Then, under the lock, the
// freshness guard keeps the documents whose key has no node, a stub, or
// an older version (or the same version, for a [graph.Doc] marked Repair,
// which replaces the node whole); those become one log record, appended
// and then applied in memory, so the log's order is the order readers
// observe. Replaying the log stores its nodes as they are, so a repair
// survives a restart like any other write.
// With [Options.SyncEvery] zero the call syncs the log before it returns
// (concurrent calls share one sync); otherwise a background loop syncs at
// that interval. A call whose documents are all stale writes nothing.
//
// A crash leaves a prefix of the records: a torn final record is
// truncated away at Open, so an Apply call is in the graph whole or not at
// all. A damaged record anywhere else is a [*CorruptError] and Open fails;
// the graph is derived data and can be rebuilt from the stream.
//
// Compaction (see [wal.Log.Compact]) writes every node, stubs included, to
// a snapshot from a copied slice of pointers (nodes are replaced, never
// modified), without holding the lock; Open loads the snapshot and then
// replays the logs after it, rebuilding the reverse index as it goes.
//
// # Reads
//
// [Store.Document] and [Store.ScanDocuments] return copies. ScanDocuments
// takes the list of keys, then reads and hands them to its callback in
// batches, holding the lock only while it copies a batch.
package embedded
