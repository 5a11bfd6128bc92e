// Package contract is converge's public identity contract and event schema.
//
// Producers, the writer, the relay, the projectors and the verifier all
// compute identity the same way, from this package alone, so that a second
// delivery of the same input leaves every store exactly as the first did:
//
//   - Every identifier is a pure function of (entity, version, position):
//     a UUIDv5 under one fixed namespace per family ([DocumentNS], [ChunkNS],
//     [EventNS], [EffectNS]). No clock, counter or random value ever enters an
//     identity. See [DocumentID], [ChunkID], [EventID] and [EffectID].
//   - A [Document] is validated and normalised ([Document.Normalize]) before it
//     is hashed; [ContentHash] is the SHA-256 of its canonical JSON form, so the
//     same (key, version) with different content is detectable as a conflict.
//   - An [Event] is self-sufficient (projectors never read Postgres) and
//     self-verifying: [DecodeEvent] recomputes every identifier and the content
//     hash from the event's own fields and rejects an event whose claims do not
//     hold.
//   - Subjects are keyed by document identity ([Subject]), so two versions of
//     one document are ordered on one subject.
//
// This package imports no other package of the module and is safe to vendor
// into producers.
package contract
