// Acknowledgement of a batch's messages: acknowledged, handed back (nak)
// or dead-lettered, with their deadlines kept alive while the batch is
// applied.

package projector

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
)

func (r *Runtime) ack(it *item) {
	for _, m := range it.superseded {
		_ = m.Ack()
	}
	if err := it.msg.Ack(); err != nil {
		// Redelivered later and skipped by the store's version marker.
		r.log.Warn("ack failed", "key", it.ev.Key, "err", err)
	}
	r.settle(it.msg)
}

func (r *Runtime) nak(it *item, delay time.Duration) {
	for _, m := range append([]jetstream.Msg{it.msg}, it.superseded...) {
		ev := it.ev
		if m != it.msg {
			ev = nil // an older version's
		}
		r.owe(m, ev, delay)
		if delay > 0 {
			_ = m.NakWithDelay(delay)
		} else {
			_ = m.Nak()
		}
	}
}

// deadLetter stores m on converge.dlq.<name> with the reason and then
// acknowledges it. If the dead letter cannot be stored, m is left for
// redelivery and deadLetter reports false.
func (r *Runtime) deadLetter(ctx context.Context, m jetstream.Msg, code string, reason error) bool {
	if err := deadletter.Publish(ctx, r.js, r.cfg.Name, m, code, reason, r.cfg.RetryMin); err != nil {
		r.owe(m, nil, r.cfg.RetryMin) // handed back by Publish
		r.log.Error("dead-letter publish failed; message left for redelivery", "subject", m.Subject(), "err", err)
		return false
	}
	if err := m.Ack(); err != nil {
		r.log.Warn("ack of a dead-lettered message failed; it will be dead-lettered again, and stored once", "err", err)
	}
	r.settle(m)
	r.metrics.DeadLetters.WithLabelValues(code).Inc()
	r.log.Warn("message dead-lettered", "subject", m.Subject(), "code", code, "reason", reason)
	return true
}

// keepAlive tells the server, every third of AckWait, that msgs are in
// progress, until the returned function is called.
func (r *Runtime) keepAlive(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(r.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
