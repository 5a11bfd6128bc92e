// Acknowledgements consumed in publish order, and the positions they
// confirm (see "What is confirmed when" in the package documentation).

package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// flushMargin is how long after acknowledging a message a live NATS server
// has surely written it to its file store: it acknowledges before it
// writes (within milliseconds, measured). A transaction whose every
// acknowledgement arrived this long before the last acknowledgement of a
// session is stored even if the server died right after that last one.
const flushMargin = 500 * time.Millisecond

// txAck is a confirmed transaction's end and when the newest
// acknowledgement consumed by then arrived.
type txAck struct {
	end pglogrepl.LSN
	at  time.Time
}

// storedUpTo is, once publishing failed, the end of the newest
// transaction whose acknowledgements all arrived flushMargin or more
// before the session's last acknowledgement: the server was alive that
// long after acknowledging it, so it wrote it out. What came later may
// have died with the server and is published again; what the server
// stored of it, the duplicate window drops.
func (s *session) storedUpTo() pglogrepl.LSN {
	_ = s.drain(context.Background(), false) // what arrived before the failure
	last := s.pub.lastAck()
	stored := s.storedEnd
	for _, a := range s.acks[s.acksHead:] {
		if a.at.After(last.Add(-flushMargin)) {
			break
		}
		stored = a.end
	}
	return stored
}

// pending is a publish awaiting its acknowledgement, or (!pub) the end of a
// transaction, confirmable once everything before it is acknowledged.
type pending struct {
	pub        bool   // a publish, not the end of a transaction
	effects    bool   // the publish to the effects' stream of the event before it
	seq        uint64 // the publisher's sequence of the publish
	sent       time.Time
	commitTime time.Time
	endLSN     pglogrepl.LSN
	size       int
	reemission bool // a re-emitted event
}

// confirmedAt notes that the transaction ending at end was confirmed, its
// acknowledgements having arrived by s.newestAck.
func (s *session) confirmedAt(end pglogrepl.LSN) {
	s.acks = append(s.acks, txAck{end: end, at: s.newestAck})
	horizon := s.newestAck.Add(-flushMargin)
	for s.acksHead < len(s.acks) && !s.acks[s.acksHead].at.After(horizon) {
		s.storedEnd = s.acks[s.acksHead].end
		s.acksHead++
	}
	if s.acksHead > 1024 && s.acksHead*2 > len(s.acks) {
		s.acks = s.acks[:copy(s.acks, s.acks[s.acksHead:])]
		s.acksHead = 0
	}
}

func (s *session) confirm(lsn pglogrepl.LSN) {
	if lsn <= s.confirmed {
		return
	}
	s.confirmed = lsn
	s.relay.confirmed.Store(uint64(lsn))
	s.relay.metrics.ConfirmedLSN.Set(float64(lsn))
}

// drain consumes acknowledgements in publish order, confirming the end of
// every transaction reached. With block, it waits until at least one
// publish is acknowledged (the window is full), still reporting status to
// Postgres meanwhile so the connection is not timed out.
func (s *session) drain(ctx context.Context, block bool) error {
	for s.head < len(s.queue) {
		p := &s.queue[s.head]
		if !p.pub {
			s.confirm(p.endLSN)
			s.confirmedAt(p.endLSN)
			s.relay.metrics.Transactions.Inc()
			s.pop()
			continue
		}
		state, err := s.pub.outcome(p.seq)
		if state == ackWaiting && block {
			state, err = s.await(ctx, p)
			block = false
		}
		switch state {
		case ackWaiting:
			if s.pub.broken.Load() {
				return &publishError{err: errLostBefore}
			}
			// Whether it waits too long is checked once per status
			// interval (checkHead), not at every commit.
			s.relay.metrics.InFlight.Set(float64(s.inflight))
			return nil
		case ackFailed:
			return &publishError{err: err}
		}
		// Timed by the acknowledgement's arrival, not by when it is
		// consumed here (after the next read from Postgres, at low rates).
		acked := s.pub.ackedAt(p.seq)
		if state != ackDuplicate {
			// Stored: a duplicate's answer comes from the server's memory of
			// ids, and says nothing of whether it can store.
			s.relay.clearPublishFailure()
		}
		if acked.After(s.newestAck) {
			s.newestAck = acked
		}
		switch {
		case p.effects:
			s.relay.metrics.EffectsPublished.Inc()
			if state == ackDuplicate {
				s.relay.metrics.EffectsDuplicates.Inc()
			}
		default:
			s.relay.metrics.Published.Inc()
			if state == ackDuplicate {
				s.relay.metrics.Duplicates.Inc()
			} else if !s.pub.chained {
				s.pub.chain(p.seq)
			}
			if p.reemission {
				s.relay.metrics.Reemissions.Inc()
			}
			s.relay.metrics.PublishTime.Observe(acked.Sub(p.sent).Seconds())
			// The commit time is Postgres' wall time: the
			// acknowledgement's is this process's wall clock's.
			wallAcked := s.relay.cfg.Clock.Now().Add(-time.Since(acked))
			s.relay.metrics.CommitToAck.Observe(wallAcked.Sub(p.commitTime).Seconds())
		}
		s.inflight--
		s.inflightBytes -= p.size
		s.pop()
	}
	s.relay.metrics.InFlight.Set(float64(s.inflight))
	return nil
}

// checkHead ends the session when the oldest publish still awaiting its
// acknowledgement has waited longer than AckTimeout, or was in flight
// across a NATS reconnect: the message or its acknowledgement may be lost.
func (s *session) checkHead() error {
	if s.head == len(s.queue) || !s.queue[s.head].pub {
		return nil
	}
	if time.Since(s.queue[s.head].sent) > s.relay.cfg.AckTimeout {
		return &publishError{err: fmt.Errorf("%w: waited %v", errAckTimeout, s.relay.cfg.AckTimeout)}
	}
	if s.pub.reconnected() {
		return &publishError{err: errReconnected}
	}
	return nil
}

// await waits for the acknowledgement of p, reporting status to Postgres
// meanwhile, until it arrives, AckTimeout passes, or (shutting down) the
// shutdown deadline passes. It returns the publish's state.
func (s *session) await(ctx context.Context, p *pending) (uint32, error) {
	deadline := p.sent.Add(s.relay.cfg.AckTimeout)
	for {
		if state, err := s.pub.outcome(p.seq); state != ackWaiting {
			return state, err
		}
		if s.pub.broken.Load() {
			return ackFailed, errLostBefore
		}
		now := time.Now()
		if !now.Before(deadline) {
			return ackFailed, fmt.Errorf("%w: waited %v", errAckTimeout, s.relay.cfg.AckTimeout)
		}
		if s.pub.reconnected() {
			return ackFailed, errReconnected
		}
		if ctx.Err() != nil && !now.Before(s.stopBy()) {
			return ackFailed, errors.New("relay: shutdown timed out waiting for acknowledgements")
		}
		wait := earliest(deadline, s.nextStatus)
		if ctx.Err() != nil {
			// Shutting down: keep waiting for this ack, within the one
			// shutdown deadline shared by every wait; Postgres still hears
			// from us at the status interval.
			wait = earliest(wait, s.stopBy())
		}
		t := time.NewTimer(time.Until(wait))
		var done <-chan struct{}
		if ctx.Err() == nil {
			done = ctx.Done()
		}
		select {
		case <-s.pub.wake:
		case <-t.C:
		case <-done:
		}
		t.Stop()
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(ctx); err != nil {
				return ackFailed, err
			}
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (s *session) pop() {
	s.queue[s.head] = pending{}
	s.head++
	// Reuse the backing array once drained, so memory stays flat.
	if s.head == len(s.queue) {
		s.queue, s.head = s.queue[:0], 0
	} else if s.head > 4096 && s.head*2 > len(s.queue) {
		n := copy(s.queue, s.queue[s.head:])
		s.queue, s.head = s.queue[:n], 0
	}
}
