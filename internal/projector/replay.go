package projector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReplayFrom is where a replayed consumer starts delivering: a stream
// sequence, or a time.
type ReplayFrom struct {
	// Seq is the first stream sequence delivered again (1: everything).
	Seq uint64
	// Time, when Seq is 0, starts at the first message stored at or after
	// it.
	Time time.Time
}

// Validate reports whether from names exactly one start.
func (from ReplayFrom) Validate() error {
	switch {
	case from.Seq > 0 && !from.Time.IsZero():
		return errors.New("replay: a sequence or a time, not both")
	case from.Seq == 0 && from.Time.IsZero():
		return errors.New("replay: a sequence (1 or more) or a time is required")
	}
	return nil
}

// Replay moves the durable consumer of a projector (its [Config.Name]) on
// stream back to from, and returns the number of messages it now has
// pending. The projector, running or not, then receives every event from
// there again; its store skips the versions it already holds.
//
// A consumer's start cannot be changed in place: Replay deletes the
// consumer and creates it again at once, with the configuration it had
// (the runtime's: explicit acknowledgements, its AckWait, MaxAckPending
// and subject filter) and the new start. A running projector sees its
// consumer deleted, waits up to [ConsumerGrace] for it to come back, and
// keeps the start it finds ([Runtime] leaves where a consumer starts to
// the operator). A crash between the delete and the create leaves no
// consumer: the projector then creates it again from the stream's first
// message, which replays everything.
//
// A stream without the consumer is an error wrapping
// jetstream.ErrConsumerNotFound: there is no configuration to keep, and
// only the projector knows it.
func Replay(ctx context.Context, js jetstream.JetStream, stream, consumer string, from ReplayFrom) (pending uint64, err error) {
	if err := from.Validate(); err != nil {
		return 0, err
	}
	c, err := js.Consumer(ctx, stream, consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, fmt.Errorf("replay: stream %s has no consumer %q (has its projector ever run?): %w", stream, consumer, err)
	}
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	cfg := c.CachedInfo().Config
	cfg.OptStartSeq, cfg.OptStartTime = 0, nil
	if from.Seq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from.Seq
	} else {
		start := from.Time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	if err := js.DeleteConsumer(ctx, stream, consumer); err != nil {
		return 0, fmt.Errorf("replay: delete consumer %s: %w", consumer, err)
	}
	created, err := js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("replay: create consumer %s (the projector will recreate it from the stream's start): %w", consumer, err)
	}
	info, err := created.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("replay: consumer %s: %w", consumer, err)
	}
	return info.NumPending, nil
}
