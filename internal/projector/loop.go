// The consume loop: batches gathered from the consumer and prepared one
// ahead of the one being applied, the conditions that end the loop, and
// the hand-back of what was fetched but not applied.

package projector

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// prepared is a fetched batch, decoded and sorted into items, with its
// messages' acknowledgement deadlines kept alive until it is finished.
type prepared struct {
	fetched  int             // messages fetched, dead-lettered ones included
	msgs     []jetstream.Msg // in fetch order
	items    []*item
	stopKeep func()
	err      error // the fetch failed: the consumer must start again
}

// loop applies batches one after another while the next one is fetched
// and decoded, until ctx ends or a stop condition holds (done true). The
// fetching goroutine runs at most one batch ahead, so a batch is decoded
// while the one before it is written; batches are still applied in fetch
// order, one at a time, and each message acknowledged after its write.
func (r *Runtime) loop(ctx context.Context, cons jetstream.Consumer, it jetstream.MessagesContext) (done bool, err error) {
	stopCtx, stopFetch := context.WithCancel(ctx)
	batches := make(chan prepared) // unbuffered: the fetcher holds the one batch ahead
	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		for stopCtx.Err() == nil {
			msgs, err := r.gather(stopCtx, it)
			b := prepared{fetched: len(msgs), err: err}
			if err == nil && len(msgs) > 0 {
				b = r.prepare(ctx, msgs)
			}
			select {
			case batches <- b:
				if err != nil {
					return
				}
			case <-stopCtx.Done():
				r.releaseBatch(stopCtx, b)
				return
			}
		}
	}()
	defer func() {
		// The iterator is released after the fetcher stopped using it.
		stopFetch()
		<-fetched
	}()

	settle := time.Duration(0) // > 0: the stop condition is checked again after it
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	for {
		var recheck <-chan time.Time
		if settle > 0 {
			again.Reset(settle)
			recheck = again.C
		}
		select {
		case <-ctx.Done():
			return true, nil
		case b := <-batches:
			again.Stop()
			if b.err != nil {
				return false, b.err
			}
			// In fetch order, which is the stream's, and here, where the
			// batch's messages are acknowledged or handed back: the gap
			// detector sees a redelivery and a hand-back in the order
			// they happen. (An empty batch reports what is due.)
			r.checkGaps(ctx, b.msgs)
			r.saveSeen(ctx) // before the batch's acknowledgements
			r.finish(ctx, b)
			if f := r.fenced.Load(); f != nil {
				r.log.Error("the store's lease is another instance's: writing nothing more, standing by", "err", f.Err)
				return true, f
			}
			settle = 0
			if (!r.cfg.StopWhenCaughtUp || b.fetched >= r.cfg.BatchSize) && r.cfg.StopAtSeq == 0 {
				continue
			}
		case <-recheck:
		}
		stop, settling := r.stopCondition(ctx, cons)
		if stop {
			return true, nil
		}
		// Nothing is left to deliver, but acknowledgements are still
		// counted pending: those just sent, which the server takes in a
		// moment, or messages waiting for their redelivery. Look again
		// soon rather than after a whole fetch wait.
		switch {
		case !settling:
			settle = 0
		case settle == 0:
			settle = time.Millisecond
		default:
			settle = min(2*settle, r.cfg.MaxWait)
		}
	}
}

// stopCondition reports whether Run should end (StopWhenCaughtUp, StopAtSeq),
// and whether what keeps it from ending is only acknowledgements pending:
// nothing is left to deliver.
func (r *Runtime) stopCondition(ctx context.Context, cons jetstream.Consumer) (stop, settling bool) {
	if r.cfg.StopWhenCaughtUp {
		info, err := cons.Info(ctx)
		if err != nil {
			r.log.Warn("consumer info failed", "err", err)
		} else if info.NumPending == 0 && info.NumAckPending == 0 {
			return true, false
		} else {
			settling = info.NumPending == 0
		}
	}
	if r.cfg.StopAtSeq > 0 {
		info, err := cons.Info(ctx)
		if err != nil {
			r.log.Warn("consumer info failed", "err", err)
		} else if info.AckFloor.Stream >= r.cfg.StopAtSeq || (info.NumPending == 0 && info.NumAckPending == 0) {
			return true, false
		} else {
			settling = settling || info.NumPending == 0 || info.Delivered.Stream >= r.cfg.StopAtSeq
		}
	}
	return false, settling
}

// releaseBatch hands a prepared batch that will not be applied back to the
// server for prompt redelivery.
func (r *Runtime) releaseBatch(ctx context.Context, b prepared) {
	if b.stopKeep != nil {
		b.stopKeep()
	}
	r.checkGaps(ctx, b.msgs) // before its hand-back
	for _, it := range b.items {
		r.nak(it, 0)
	}
}

// release stops the iterator and hands the messages it had buffered back
// to the server for prompt redelivery, instead of leaving them to their
// acknowledgement deadline. They are checked for gaps first: the server
// counts them delivered, so the next start would not see a gap before them.
func (r *Runtime) release(ctx context.Context, it jetstream.MessagesContext) {
	it.Drain()
	var buffered []jetstream.Msg
	for {
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		if err != nil {
			break
		}
		buffered = append(buffered, m)
		_ = m.Nak()
	}
	r.checkGaps(ctx, buffered)
	for _, m := range buffered {
		var ev *contract.Event
		if d := r.decode(m); d.it != nil {
			ev = d.it.ev
		}
		r.owe(m, ev, 0) // after checkGaps, whose delivery would clear it
	}
}

// linger is how long a batch waits for one more message once it has one,
// and maxLinger how long it waits for more in all: a batch holds what
// arrives together, and never waits long to fill up, even while messages
// keep trickling in.
const (
	linger    = 2 * time.Millisecond
	maxLinger = 5 * time.Millisecond
)

// gather returns the next batch: up to BatchSize messages, waiting up to
// MaxWait for the first one. A missed heartbeat or a reconnect is not an
// error (the iterator renews its pull requests); a closed iterator is.
func (r *Runtime) gather(ctx context.Context, it jetstream.MessagesContext) ([]jetstream.Msg, error) {
	var msgs []jetstream.Msg
	var closeBy time.Time // once the first message is in
	wait := r.cfg.MaxWait
	for len(msgs) < r.cfg.BatchSize && ctx.Err() == nil {
		m, err := next(ctx, it, wait)
		switch {
		case err == nil:
			msgs = append(msgs, m)
			if len(msgs) == 1 {
				closeBy = time.Now().Add(maxLinger)
			}
			if wait = min(linger, time.Until(closeBy)); wait <= 0 {
				return msgs, nil
			}
			continue
		case errors.Is(err, nats.ErrTimeout):
		case errors.Is(err, jetstream.ErrMsgIteratorClosed), errors.Is(err, jetstream.ErrConsumerDeleted),
			errors.Is(err, jetstream.ErrConsumerNotFound):
			if len(msgs) > 0 {
				return msgs, nil // apply what arrived; the next call reports it
			}
			return nil, err
		default:
			r.log.Debug("consumer notice", "err", err)
		}
		break
	}
	return msgs, nil
}

// next waits up to wait for the iterator's next message; a wait longer
// than a linger also ends when ctx does, so that stopping does not wait
// for a whole fetch wait. Both ends of a wait are nats.ErrTimeout.
func next(ctx context.Context, it jetstream.MessagesContext, wait time.Duration) (jetstream.Msg, error) {
	if wait <= linger {
		return it.Next(jetstream.NextMaxWait(wait))
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m, err := it.Next(jetstream.NextContext(wctx))
	if err != nil && wctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return nil, nats.ErrTimeout
	}
	return m, err
}
