package contract

import (
	"crypto/sha256"
	"encoding/hex"
)

// Subject prefixes. Keys are not NATS-safe (they may hold dots, spaces and
// wildcards), so a subject carries a fixed-length token of the key's hash.
const (
	DocsSubjectPrefix   = "converge.docs."
	EventsSubjectPrefix = "converge.events."
	IngestSubjectPrefix = "converge.ingest."
	DLQSubjectPrefix    = "converge.dlq."
	// TokenLength is the length of a subject token in characters.
	TokenLength = 32
)

// DocsStream is the JetStream stream of document events, on
// converge.docs.>: the relay is its only publisher, every projection
// consumes it.
const DocsStream = "CONVERGE_DOCS"

// EventsStream is the JetStream stream of every document event for the
// consumers that must see each one (effects: the notifier), on
// converge.events.>. The relay publishes each event to it as well as to
// DocsStream (when it runs with effects on), and stays its only publisher.
// Its retention is a work queue: an event stays until its consumer
// acknowledged it, or until the stream's age limit (the effects' window)
// passed, whatever the consumer's lag. DocsStream's per-subject history
// bounds what a projection replays; this stream bounds nothing by subject.
const EventsStream = "CONVERGE_EVENTS"

// RemovalsStream is the JetStream stream that keeps the server's record of
// each event [EventsStream]'s limits (its age or size) removed while a
// consumer held it delivered and unacknowledged: the advisories
// [RemovalsSubject] of that stream, which the server publishes at the
// removal whether or not the consumer runs. The relay creates it with
// EventsStream. The notifier reads it to report such an event missed even
// when the removal happened while it was down (a crash leaves no other
// trace of it: on a work queue the server counts the removal as an
// acknowledgement).
const RemovalsStream = "CONVERGE_EVENTS_REMOVALS"

// RemovalsSubject is the subject of the server's advisories of messages
// of stream that a consumer had delivered and that the stream then
// removed: $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>
// ("*" for every consumer).
func RemovalsSubject(stream, consumer string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + stream + "." + consumer
}

// MetaEventsDocsSeq is the key, in [EventsStream]'s metadata, of the last
// sequence [DocsStream] had when the relay created EventsStream: every
// later event of DocsStream is in EventsStream too. A notifier that
// consumed DocsStream before (an older deployment) finishes its consumer
// there up to that sequence, then consumes EventsStream.
const MetaEventsDocsSeq = "converge.docs_last_seq"

// KeyHash is the SHA-256 of a document key. Subject tokens and verification
// buckets derive from it.
func KeyHash(key string) [sha256.Size]byte {
	return sha256.Sum256([]byte(key))
}

// SubjectToken is the NATS-safe token of a key: the lowercase hex of the first
// 16 bytes of its SHA-256, always [TokenLength] characters.
func SubjectToken(key string) string {
	h := KeyHash(key)
	return hex.EncodeToString(h[:TokenLength/2])
}

// Subject is the stream subject of a document's events:
// "converge.docs.<token>". All versions of one document share it, so they
// are ordered.
func Subject(key string) string { return DocsSubjectPrefix + SubjectToken(key) }

// EventsSubject is the subject of a document's events in [EventsStream]:
// "converge.events.<token>", the token of [Subject].
func EventsSubject(key string) string { return EventsSubjectPrefix + SubjectToken(key) }

// IngestSubject is the subject a producer publishes a document to when it
// uses the queue path into the writer: "converge.ingest.<token>".
func IngestSubject(key string) string { return IngestSubjectPrefix + SubjectToken(key) }

// DLQSubject is the dead-letter subject of a consumer, "converge.dlq.<name>".
func DLQSubject(consumer string) string { return DLQSubjectPrefix + consumer }

// HeaderCommitTime is set by the relay on every stream message, besides
// Nats-Msg-Id (the event id): the Postgres commit time of the event's
// transaction, RFC 3339 with nanoseconds. Consumers measure commit-to-applied
// latency from it.
const HeaderCommitTime = "Converge-Commit-Time"

// HeaderReemission is set by the relay on a re-emitted event: an event
// written to the outbox again (converge backfill, converge verify
// --repair) for a document version already emitted, to repair a
// projection. Its value is the re-emission's number (decimal, > 0, from
// the outbox's emission sequence), and the message's Nats-Msg-Id is then
// "<event id>.<emission>", so that the stream's duplicate window does not
// drop it as a copy of the original. The event itself is the original's,
// byte for byte. Projectors apply it as a repair: a store that holds the
// same version writes it again instead of skipping it; an older version
// is still skipped. An original emission carries no such header.
const HeaderReemission = "Converge-Reemission"
