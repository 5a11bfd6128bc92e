// Package docstore is the writer's access to Postgres: the only code that
// writes the documents, chunks and outbox tables.
//
// # Write order
//
// A write of one or more document versions is one transaction: for a
// batch whose keys are distinct, a pipeline of two statements with a single
// Sync (an implicit transaction, one network round trip); for a batch with a
// key repeated, an explicit transaction with one write statement per
// occurrence. Inside it:
//
//  0. pg_advisory_xact_lock on each key's hash, in hash order: writers of
//     the same key are serialised, so each write's snapshot already sees
//     the chunks the previous writer committed.
//  1. documents: INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
//     excluded.version > documents.version — the freshness guard. Only the
//     rows it returns ("applied") take part in the next steps.
//  2. chunks: the applied documents' old chunks are deleted and the new
//     version's chunks inserted, under their derived ids.
//  3. outbox: one row per applied (key, version, kind), keyed by the derived
//     event id, carrying the canonical event.
//
// Steps 1 to 3 are one SQL statement.
// A crash before the commit leaves nothing; after it, everything. There is
// no state in which a document changed without its outbox row, or the
// reverse.
//
// # Results
//
// The write statement also reports, for each input, the stored row its
// freshness guard compared against (read in the same snapshot, under the
// key locks). A version not applied is classified from it: a newer stored
// version makes it [Stale]; the same version with the same content hash
// makes it [Unchanged] (a redelivery: no second outbox row); the same
// version with other content is a [*ConflictError].
//
// Serialization failures, deadlocks and errors pgconn reports safe to retry
// are retried with backoff; the statement is atomic, so a retry cannot
// apply anything twice.
//
// # Re-emission
//
// [Store.Reemit] and [Store.ReemitAll] write the event of documents'
// current versions to the outbox again, under the same key locks, with a
// fresh emission number, so that the relay publishes them again and the
// projections rewrite them; see [Store.Reemit] for their write order. They
// rebuild each event from the stored rows and refuse, with a
// [*NotReproducibleError], a document whose rows do not rebuild the event
// that was emitted.
package docstore
