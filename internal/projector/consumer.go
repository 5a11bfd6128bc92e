// The durable consumer: created or updated at each start, its previous
// pinned client unpinned, its lag measured and a stall detected.

package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/retry"
)

// unpin releases the consumer's pinned client. (A request of its own:
// jetstream's UnpinConsumer reads the stream's info first, which the
// notifier may not do on the documents' stream.)
func (r *Runtime) unpin(ctx context.Context) error {
	req, _ := json.Marshal(map[string]string{"group": PinGroup})
	m, err := r.js.Conn().RequestWithContext(ctx, fmt.Sprintf("$JS.API.CONSUMER.UNPIN.%s.%s", r.cfg.Stream, r.cfg.Name), req)
	if err != nil {
		return err
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("unpin: unreadable answer %q: %w", m.Data, err)
	}
	if resp.Error != nil && resp.Error.ErrorCode != jetstream.JSErrCodeConsumerNotFound {
		return resp.Error
	}
	return nil
}

// PinGroup is the priority group of every runtime's consumer: the server
// delivers to one pinned client of it.
const PinGroup = "writer"

// ConsumerGrace is how long a runtime whose consumer was deleted waits for
// it to be recreated (converge replay does that at once) before creating it
// again itself, from the stream's first message.
var ConsumerGrace = 2 * time.Second

// consumerConfig is the durable consumer of a runtime of c (defaults
// applied), delivering from the stream's first message.
func consumerConfig(c Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.Name,
		Description:   "converge projector " + c.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxAckPending: 4 * c.BatchSize,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: c.SubjectPrefix + ">",
		MaxDeliver:    -1, // dead letters are the runtime's decision
		// One pinned client: a process that stopped pulling (killed,
		// paused, fenced) gets nothing more once the next one unpins it,
		// even through the pull requests it left waiting on the server.
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PinGroup},
		PinnedTTL:      c.AckWait,
	}
}

// consume creates (or updates) the durable consumer and applies batches
// until ctx ends, or with StopWhenCaughtUp until nothing is pending (done
// true). An error is a reason to start again: the consumer was deleted, the
// connection closed.
func (r *Runtime) consume(ctx context.Context) (done bool, err error) {
	cc := consumerConfig(r.cfg)
	switch existing, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Name); {
	case err == nil:
		// Where it starts is the operator's (converge replay); the rest is
		// the runtime's.
		ec := existing.CachedInfo().Config
		cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = ec.DeliverPolicy, ec.OptStartSeq, ec.OptStartTime
		cc.Metadata = ec.Metadata // the gap record
	case errors.Is(err, jetstream.ErrConsumerNotFound) && r.consumed:
		// The consumer this runtime used is gone: an operator may be
		// replacing it (converge replay). Give them time before starting
		// again from the stream's first message.
		_ = retry.Sleep(ctx, ConsumerGrace) // an ended ctx fails the calls below
		if existing, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Name); err == nil {
			ec := existing.CachedInfo().Config
			cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = ec.DeliverPolicy, ec.OptStartSeq, ec.OptStartTime
			cc.Metadata = ec.Metadata // the gap record
		}
	}
	cons, err := r.js.CreateOrUpdateConsumer(ctx, r.cfg.Stream, cc)
	if err != nil {
		return false, fmt.Errorf("projector %s: consumer on stream %s: %w", r.cfg.Name, r.cfg.Stream, err)
	}
	// This runtime is the consumer's only client (the lease says so, where
	// instances stand by): whoever was pinned before is not any more.
	if err := r.unpin(ctx); err != nil {
		r.log.Warn("unpinning the consumer's previous client failed", "err", err)
	}
	// Two batches buffered in the client: the next batch is on its way
	// while one is applied.
	it, err := cons.Messages(jetstream.PullMaxMessages(2*r.cfg.BatchSize), jetstream.PullPriorityGroup(PinGroup))
	if err != nil {
		return false, fmt.Errorf("projector %s: %w", r.cfg.Name, err)
	}
	r.startGaps(ctx, cons.CachedInfo())
	defer r.release(ctx, it)
	r.consumed = true
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	loopCtx, stall := context.WithCancelCause(ctx)
	defer stall(nil)
	go r.watchLag(lagCtx, cons, func() { stall(errStalled) })
	r.once.Do(func() { close(r.ready) })
	r.log.Info("projecting", "stream", r.cfg.Stream, "batch", r.cfg.BatchSize, "parallel", r.cfg.Parallel)

	done, err = r.loop(loopCtx, cons, it)
	if ctx.Err() == nil && errors.Is(context.Cause(loopCtx), errStalled) {
		return false, errStalled
	}
	return done, err
}

// errStalled ends a consume whose consumer delivers nothing while it has
// messages to deliver: Run starts it again.
var errStalled = errors.New("the consumer delivered nothing while it had messages pending")

func (r *Runtime) watchLag(ctx context.Context, cons jetstream.Consumer, stalled func()) {
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	var lastDelivered, lastFloor uint64
	idle := 0
	for {
		if info, err := cons.Info(ctx); err == nil {
			r.metrics.Pending.Set(float64(info.NumPending + uint64(info.NumAckPending)))
			// Messages to deliver, room to deliver them (not held back by
			// MaxAckPending: redeliveries waiting for a receiver), this
			// runtime idle (no batch being applied), and neither a
			// delivery nor an acknowledgement
			// since the last look, twice running: the pull requests are
			// not being served (the pin held by requests the server no
			// longer answers, after a consumer leader change on a
			// cluster). Starting again unpins and pulls anew.
			switch {
			case info.NumPending > 0 && !r.applying.Load() && info.Delivered.Stream == lastDelivered && info.AckFloor.Stream == lastFloor &&
				(info.Config.MaxAckPending <= 0 || info.NumAckPending < info.Config.MaxAckPending):
				idle++
			default:
				idle = 0
			}
			lastDelivered, lastFloor = info.Delivered.Stream, info.AckFloor.Stream
			if idle >= 2 {
				r.log.Warn("the consumer has messages to deliver but delivers none; pulling again", "pending", info.NumPending)
				stalled()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
