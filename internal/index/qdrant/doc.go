// Package qdrant is the [index.Backend] on a Qdrant collection, spoken to
// over gRPC with the official client.
//
// One collection holds two kinds of points, told apart by the payload field
// "type":
//
//   - chunk points ("type": "chunk"): id [index.Point].ID, the chunk's
//     vector, and the payload key, version, ordinal, content_hash,
//     chunk_hash, title, tags and text;
//   - document markers ("type": "marker"): one per document, id
//     contract.DocumentID(key), payload key, version, deleted and
//     content_hash, plus version_high and version_low (the version's upper
//     and lower 32 bits, which compare exactly where a float range on the
//     whole version would not). A collection requires a vector on every
//     point, so a marker carries the fixed unit vector (1, 0, ..., 0);
//     every chunk search and count filters on type "chunk".
//
// Markers are written with Qdrant's conditional upsert (update_filter,
// Qdrant 1.16 or later, which [New] checks): a stored marker is replaced
// only when its version is lower than the new one, so the freshness guard
// holds at the store even against a writer that skipped its own check.
// Chunk points carry version_high and version_low too, and every delete is
// bounded by a version: [Backend.DeleteStale] removes only versions lower
// than the one kept, [Backend.Retract] only the one named, so a writer
// that resumes late with an older version never deletes a newer one's
// points. A chunk point's id is its version's (contract.ChunkID), so an
// upsert can only replace points of its own version; the points a late
// writer inserts are removed as the package index describes. Of the chunk
// points written before they carried version_high, DeleteStale removes
// every version but the kept one, as it did before.
//
// Writes are sent with wait=true: a call returns once Qdrant has applied
// them. The [index.Index] above orders the writes of one document; if the
// process stops between two of them, the next delivery of the event repeats
// them, and every write here is idempotent (same ids, same payloads).
//
// [Backend.SwitchAlias] repoints an alias in one request, so a rebuild can
// fill a new collection and then switch readers to it atomically (configure
// Collection with the alias name to follow it); [Backend.DropCollection]
// then removes the old collection, and refuses while an alias names it.
//
// Vectors read back are unit length: Qdrant normalises the vectors of a
// cosine collection when it stores them.
//
// A failed request returns an [*Error], which names the operation and the
// collection and keeps the gRPC status as its cause. [Backend.Ensure]
// checks with a write that changes nothing that the API key may write, and
// returns a [*WriteDeniedError] for a key that may only read; a write
// refused later (the key changed under a running projector) is retried,
// not dead-lettered.
package qdrant
