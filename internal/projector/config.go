// The configuration of a [Runtime] and its defaults.

package projector

import (
	"context"
	"errors"
	"time"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/pkg/contract"
)

// Config of a [Runtime]. Zero fields take the defaults documented on them.
type Config struct {
	// Name of the projector: its durable consumer, and its dead-letter
	// subject converge.dlq.<Name>. Required.
	Name string
	// Stream consumed; default CONVERGE_DOCS.
	Stream string
	// SubjectPrefix is the prefix of the stream's subjects, each followed
	// by a document's token (contract.SubjectToken): the consumer's filter
	// is SubjectPrefix + ">", and an event on another document's subject is
	// dead-lettered. Default contract.DocsSubjectPrefix.
	SubjectPrefix string
	// StopAtSeq, when not 0, ends Run once every message of the stream up
	// to this sequence has been acknowledged (or nothing is pending): the
	// end of a consumer that another replaces from there on (the
	// notifier's move to the effects' stream).
	StopAtSeq uint64
	// BatchSize is the most messages fetched and applied at once; default 256.
	BatchSize int
	// MaxWait is how long a fetch waits to fill a batch; default 200ms.
	MaxWait time.Duration
	// Parallel is how many shards of a batch (by document) are applied at
	// once; default 2.
	Parallel int
	// AckWait is the consumer's redelivery timeout; the runtime extends it
	// while a batch is being applied. Default 60s.
	AckWait time.Duration
	// MaxDeliver is the number of deliveries after which a message whose
	// store write fails permanently is dead-lettered; default 5.
	MaxDeliver int
	// RetryMin and RetryMax bound the backoff of transient retries, of
	// redeliveries and of restarts (the shared [retry.Backoff]: RetryMin
	// doubled per attempt, capped at RetryMax); defaults 100ms and 30s.
	RetryMin, RetryMax time.Duration
	// RetryJitter is the random fraction of each backoff, so that the
	// projectors and replicas a store outage failed together do not all
	// come back at the same instant; 0 means retry's default (half),
	// retry.NoJitter exact delays.
	RetryJitter float64
	// StopWhenCaughtUp ends Run once the consumer has nothing pending
	// (rebuilds, tests); otherwise Run waits for new events until ctx ends.
	StopWhenCaughtUp bool
	// LagInterval is how often the consumer's pending count is measured;
	// default 5s.
	LagInterval time.Duration
	// EveryEvent hands the store every event of a batch, several versions
	// of one document included (in stream order, in one shard, with the
	// repairs in their own call after the originals), instead of only the
	// newest version of each document: for a store whose effect is one per
	// event (the notifier) rather than a document's state. An event the
	// store asks to have redelivered ([Redeliver]) comes back after the
	// later versions of its document that succeeded meanwhile. A runtime
	// with EveryEvent also reports every event it never received (see
	// [GapRecord]).
	EveryEvent bool
	// Removals, with EveryEvent on a work queue, is the stream that keeps
	// the server's advisories of this stream's messages its limits removed
	// while delivered and unacknowledged (contract.RemovalsStream for the
	// effects' stream): each is reported missed from there, also when the
	// removal happened while no runtime ran (see removals.go). "": none,
	// and such a removal is reported only while a runtime knows of it.
	Removals string
	// Replicas of the dead letters' stream when this runtime creates it
	// (3 on a NATS cluster); default 1.
	Replicas int
	// Fence, when set, is asked before every store write: an error means
	// this instance may no longer write (another holds its lease). The
	// batch is then neither written nor acknowledged (the instance that
	// took over gets its messages again), and Run returns the error
	// wrapped in [FencedError].
	Fence func(ctx context.Context) error
	// Writable, when set, reports whether the term still lets this
	// instance write; each store call's context carries it (see
	// [WithWritable]) for work the store goes on with after the call.
	Writable func() bool
	// Bound, when set, gives each store call a context that ends when the
	// term the call started in does (lease.Term.Bound): a call cut off
	// that way is neither acknowledged nor retried by this writer, but
	// ends Run as a [FencedError].
	Bound func(ctx context.Context) (context.Context, context.CancelFunc)
	// Clock is the wall clock of the times this runtime writes for
	// others and of the ages it computes from a time another process
	// wrote (an event's commit time); nil: clock.Wall().
	Clock clock.Clock
}

// The defaults of a [Config]'s fields, and of the flags that set them
// ([ServiceFlags]).
const (
	DefaultBatchSize  = 256
	DefaultParallel   = 2
	DefaultAckWait    = 60 * time.Second
	DefaultMaxDeliver = 5
)

func (c *Config) setDefaults() error {
	if c.Name == "" {
		return errors.New("projector: a name is required (it names the durable consumer and the dead-letter subject)")
	}
	if c.Stream == "" {
		c.Stream = contract.DocsStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = contract.DocsSubjectPrefix
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 200 * time.Millisecond
	}
	if c.Parallel <= 0 {
		c.Parallel = DefaultParallel
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.Clock == nil {
		c.Clock = clock.Wall()
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(30*time.Second, c.RetryMin)
	}
	if c.LagInterval <= 0 {
		c.LagInterval = 5 * time.Second
	}
	return nil
}
