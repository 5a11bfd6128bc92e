// Package notifier is the one non-idempotent effect of converge: it POSTs a
// signed JSON notification to each configured webhook URL when a document
// version is upserted or withdrawn. It runs over the projector runtime
// (package projector) as a [projector.DeliveryStore], consuming every event
// of CONVERGE_EVENTS ([RuntimeConfig]: each version is notified, not only
// the newest of a batch). That stream, published by the relay beside
// CONVERGE_DOCS, keeps each event until the notifier acknowledged it (a work
// queue, bounded by the window's age), so the notifier's lag and outages
// do not decide what it sees, as CONVERGE_DOCS's per-document history
// would; what the stream's limits remove unread is reported as missed.
// [Migrate] moves a notifier of an older deployment off CONVERGE_DOCS.
//
// # Effects and their identity
//
// One notification to one URL is one effect. Its id is
// contract.EffectID("webhook:"+url, eventID), a UUIDv5 sent as the
// Idempotency-Key header: every attempt of an effect carries the same key,
// and two effects never share one. Each URL is a separate effect, so a slow
// or failing receiver never makes the notifier resend to the others.
//
// # The dedup store and the order of writes
//
// The notifier is the single writer of its dedup store, the JetStream
// key-value bucket CONVERGE_EFFECTS, keyed by effect id, whose TTL is the
// dedup window (Config.Window, default 7 days, plus Config.ClockSkew). Per
// effect:
//
//  1. claim: create the record "claimed" if absent (create-if-absent), or
//     take over a "failed" record whose backoff has passed, or a "claimed"
//     one that has stayed unchanged for Config.ClaimTimeout (compare-and-set
//     on its revision); a record "sent" means the effect is done: it is
//     deduplicated;
//  2. send the POST;
//  3. mark: "sent" on a 2xx answer; otherwise "failed" with a backoff
//     (exponential, with jitter), or "dead" after Config.MaxAttempts
//     attempts, when the event is dead-lettered to converge.dlq.<name> with
//     the HTTP status and an excerpt of the answer's body (the dead records
//     of the event are then deleted, so that a redrive starts afresh, with
//     the same keys; if the dead letter cannot be stored, the event is
//     redelivered and its failing effects are tried MaxAttempts times
//     more).
//
// The message of the event is acknowledged only once each of its effects is
// sent (or deduplicated); otherwise it is redelivered after the delay the
// effects ask for, or dead-lettered.
//
// A crash between 1 and 2 leaves a claim that nobody sends: it is taken
// over once it is older than ClaimTimeout, and the resend carries the same
// Idempotency-Key. A crash between 2 and 3 leaves a claim whose effect was
// sent: it is sent again after ClaimTimeout, with the same key, and the
// receiver deduplicates it. A crash after 3 leaves nothing to do: the
// redelivered event finds "sent".
//
// # Time
//
// A record holds wall times (when it entered its state, and for "failed"
// when the next attempt is due), read from its writer's clock
// (Config.Clock), for people reading the bucket. No decision compares them
// with this process's wall clock: clocks disagree, and step. A claim is
// stale once this process has seen its revision unchanged for
// ClaimTimeout, measured on its own monotonic clock (the rule of package
// lease): a claim is never taken over before ClaimTimeout has passed since
// it was written, however the clocks step, and a dead process's claim is
// taken over at most ClaimTimeout after it is first seen. A backoff lasts
// at most its recorded delay (next less at, both its writer's readings)
// from when this process first saw the record. What still reads the wall
// clock: an event's age against the window (its commit time is Postgres'),
// and the signature's timestamp, which the receiver checks against its
// own clock.
//
// # What is guaranteed
//
//   - From the notifier's side, at most one successful (2xx-answered)
//     delivery per effect id within the window: an effect whose record says
//     "sent" is never sent again while the record lives.
//   - To the receiver, at least once: a crash or a lost answer makes the
//     notifier send again, always with the same Idempotency-Key and the
//     same body, so the receiver can deduplicate on the key.
//   - Replays and rebuilds cause no new effects: an event committed within
//     the window finds its record (records outlive the commit time by the
//     window, since an effect is sent after its commit), and an event
//     committed longer than the window ago is not notified at all
//     (counted as skipped "beyond_window") unless Config.NotifyReplayed. A
//     re-emitted event (contract.HeaderReemission: converge backfill,
//     verify --repair) repairs projections and is not notified either
//     ("reemission"), unless Config.NotifyReplayed.
//
// Beyond the window the record has expired: with NotifyReplayed, an event
// replayed after that is notified again, with the same Idempotency-Key.
// Without it, an event that reaches the notifier more than a window after
// its commit (the notifier was down longer than the window) is not
// notified: the window must exceed the longest outage of the notifier.
//
// # Order and concurrency
//
// Sends run concurrently, at most Config.Concurrency per URL. A batch waits
// at most Config.SendWait for its answers: a send still in flight then
// finishes in the background while its event is redelivered later, so a
// slow receiver holds at most Concurrency requests and delays no other
// document. Notifications of one document may therefore arrive out of
// version order (as retries may make them anyway): receivers order them by
// version.
//
// # Webhook URLs are credentials
//
// A webhook URL often carries its credential: a token in its path (Slack's
// and Discord's webhooks), its query, or its user info. The URL goes into
// the requests, and, hashed, into the effect ids; nothing else quotes it.
// Logs, metrics (the target label), effect records, dead letters, spans,
// errors and the service's start-up line name a target by its public
// name: the URL's scheme and host, "/…" if anything followed them, and
// "#2", "#3" for the second and third URL sharing that name, in the
// order of Config.URLs. A transport error is reported without the
// *url.Error that quotes the URL, and the parts of the URL the name leaves
// out are replaced by "…" in the transport's message and in the excerpt
// of a receiver's answer (which may quote the request's path). An invalid
// URL is reported by its position in the list and the kind of problem,
// never by its text.
//
// # Signature
//
// Each request carries Converge-Timestamp (Unix seconds of the attempt) and
// Converge-Signature: "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." +
// body)). See [Sign] and [Verify].
package notifier
