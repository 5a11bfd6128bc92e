// Package projector is the runtime shared by every projector: the single
// writer of one store (the index, the graph), converging it to the events of
// the stream CONVERGE_DOCS whatever the number of deliveries, their order,
// or a rebuild from scratch.
//
// The order of work, per batch:
//
//  1. fetch up to BatchSize messages from a durable pull consumer with
//     explicit acknowledgements;
//     With Config.EveryEvent, a stream sequence the fetch stepped over (an
//     event purged before it was read) is counted and logged as a gap
//     (see [GapRecord]), in fetch order, before the batch is sharded;
//  2. decode each message (by Parallel workers, while the batch before is
//     still being applied: batches are fetched and decoded one ahead, and
//     applied one after another); one that is not a valid event is
//     dead-lettered to converge.dlq.<name> at once (it can never apply);
//  3. keep only the newest version of each document (older versions of it
//     in the batch share the newest one's fate), unless Config.EveryEvent
//     asks for every event;
//  4. apply the events (documents in parallel, Parallel shards; versions of
//     one document never, since a document is in one shard of a batch and
//     batches run one after another); the store's freshness guard skips
//     a version older than the one it holds;
//  5. acknowledge each message only after its store write succeeded. A
//     transient store error (the store is down) is retried in place with
//     backoff, forever, keeping the messages' acknowledgement deadlines
//     alive; an error the store marks [Permanent] naks the message with a
//     delay, and after MaxDeliver deliveries dead-letters it, so the stream
//     never stalls and nothing vanishes. A store that keeps its own count of
//     attempts decides instead: [Redeliver] naks the message with the
//     store's delay, [DeadLetter] dead-letters it at once.
//
// A redelivered message (an acknowledgement lost, a crash before it) is
// applied again: the store skips it by its version marker.
//
// # Repairs
//
// A message with the header contract.HeaderReemission re-emits a version
// already emitted, to repair a store damaged behind its projector's back.
// It takes part in step 3 like any other (the newest version of a document
// wins; at equal versions the repair is kept), and the repairs of a batch
// are applied in their own store calls, whose context is marked with
// [WithRepair]: the store then writes an event whose version it already
// holds again, instead of skipping it. An older version is still skipped.
package projector

import (
	"context"
	"time"

	"github.com/converge-sync/converge/pkg/contract"
)

// Outcome of applying one event.
type Outcome int

const (
	// Applied: the store now holds the event's version.
	Applied Outcome = iota
	// Skipped: the store already holds this version or a newer one.
	Skipped
)

// Result of applying one event: an outcome, or an error.
type Result struct {
	Outcome Outcome
	Err     error
}

// Store is a projection's store as the runtime sees it.
type Store interface {
	// Apply converges the store to events, at most one per document key
	// (with Config.EveryEvent: possibly several, in stream order), and
	// returns one result per event, in order. Errors are transient
	// (retried in place) unless marked [Permanent], [Redeliver] or
	// [DeadLetter]. With ctx marked by [WithRepair], a version equal to the
	// stored one is written again.
	Apply(ctx context.Context, events []*contract.Event) []Result
}

// Preparer is a Store that does part of a batch's work ahead: the runtime
// calls Prepare with the events of the next batch while it applies the
// current one, and Apply with the same events afterwards (perhaps fewer,
// perhaps again after a failure). Prepare must not change the store, and
// cannot fail: what it could not do, Apply does.
type Preparer interface {
	Prepare(ctx context.Context, events []*contract.Event)
}

// Forgetter is a Preparer that keeps what it prepared apart for each
// runtime (RuntimeName): a runtime calls Forget, with its name in ctx,
// when it stops (a partition handed over, a rebuild's round done), so
// that what it prepared and never applied is dropped.
type Forgetter interface {
	Forget(ctx context.Context)
}

// Delivery is an event with what its message tells besides the event.
type Delivery struct {
	Event *contract.Event
	// CommitTime is the Postgres commit time of the event's transaction
	// (the header contract.HeaderCommitTime); zero when the message has
	// none.
	CommitTime time.Time
	// Stored is when the stream stored the message; zero if unknown.
	Stored time.Time
	// Delivered counts the deliveries of the message, this one included.
	Delivered uint64
	// TraceParent is the W3C trace context the message carries ("" for
	// none): the trace of the write that made the event.
	TraceParent string
}

// DeliveryStore is a [Store] that needs to know more of each event than
// the event itself (its age, its number of deliveries): the runtime calls
// ApplyDeliveries instead of Apply, with the same contract.
type DeliveryStore interface {
	Store
	ApplyDeliveries(ctx context.Context, deliveries []Delivery) []Result
}

type repairKey struct{}

// WithRepair marks ctx for a [Store.Apply] call whose events are repairs:
// the store writes an event whose version it already holds again
// (rewriting that version whole) instead of skipping it. A version older
// than the stored one is skipped all the same.
func WithRepair(ctx context.Context) context.Context {
	return context.WithValue(ctx, repairKey{}, true)
}

// IsRepair reports whether ctx was marked by [WithRepair].
func IsRepair(ctx context.Context) bool {
	repair, _ := ctx.Value(repairKey{}).(bool)
	return repair
}

type runtimeKey struct{}

// RuntimeName is the name of the runtime whose store call ctx is ("" for
// a call of no runtime): a store that keeps work between a runtime's
// calls (a [Preparer]) keeps it apart for each of the runtimes that share
// it (a partitioned projector runs one per partition it holds).
func RuntimeName(ctx context.Context) string {
	name, _ := ctx.Value(runtimeKey{}).(string)
	return name
}
