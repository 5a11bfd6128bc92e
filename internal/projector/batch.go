// A fetched batch decoded into items: dead-lettering what is not a valid
// event, and keeping the newest version of each document.

package projector

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// item is one document of a batch: its newest event, the message carrying
// it, and the messages of older (or equal) versions it supersedes.
type item struct {
	msg        jetstream.Msg
	ev         *contract.Event
	repair     bool // the message re-emits its event (contract.HeaderReemission)
	delivered  uint64
	commitTime time.Time
	stored     time.Time
	superseded []jetstream.Msg
	trace      string // the message's traceparent, "" for none
}

// supersedes reports whether it wins over prev, an item of the same
// document: a newer version, or the same version as a repair where prev
// is not one (the repair also does what the original would).
func (it *item) supersedes(prev *item) bool {
	return it.ev.Version > prev.ev.Version || (it.ev.Version == prev.ev.Version && it.repair && !prev.repair)
}

// decoded is one message of a batch as the decoding workers leave it: an
// item, or why the message is dead-lettered.
type decoded struct {
	it     *item
	code   string
	reason error
}

// minParallelDecode is the smallest batch decoded by several workers.
const minParallelDecode = 32

// prepare decodes a fetched batch (Parallel workers share a large one),
// dead-letters what is not a valid event, keeps the newest version of each
// document (unless Config.EveryEvent), and keeps the messages'
// acknowledgement deadlines alive until the batch is finished.
func (r *Runtime) prepare(ctx context.Context, msgs []jetstream.Msg) prepared {
	b := prepared{fetched: len(msgs), msgs: msgs}
	out := make([]decoded, len(msgs))
	workers := min(r.cfg.Parallel, len(msgs)/minParallelDecode)
	if workers <= 1 {
		for i, m := range msgs {
			out[i] = r.decode(m)
		}
	} else {
		var wg sync.WaitGroup
		per := (len(msgs) + workers - 1) / workers
		for lo := 0; lo < len(msgs); lo += per {
			hi := min(lo+per, len(msgs))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := lo; i < hi; i++ {
					out[i] = r.decode(msgs[i])
				}
			}()
		}
		wg.Wait()
	}
	byKey := make(map[string]*item, len(msgs))
	for i, d := range out {
		if d.it == nil {
			r.deadLetter(ctx, msgs[i], d.code, d.reason)
			continue
		}
		it := d.it
		prev, ok := byKey[it.ev.Key]
		switch {
		case r.cfg.EveryEvent:
			b.items = append(b.items, it)
		case !ok:
			byKey[it.ev.Key] = it
			b.items = append(b.items, it)
		case it.supersedes(prev):
			it.superseded = append(prev.superseded, prev.msg)
			*prev = *it
		default:
			prev.superseded = append(prev.superseded, it.msg)
		}
	}
	if len(b.items) > 0 {
		// Keep the acknowledgement deadlines alive until the batch is
		// finished: while it waits for the batch before it, and while it is
		// applied (a slow store, transient retries).
		b.stopKeep = r.keepAlive(msgs)
		if p, ok := r.store.(Preparer); ok {
			// In the fetcher, one batch ahead: while the batch before this
			// one is applied.
			events := make([]*contract.Event, len(b.items))
			for i, it := range b.items {
				events[i] = it.ev
			}
			p.Prepare(ctx, events)
		}
	}
	return b
}

// decode reads one message: its event, checked against its subject, and
// what its headers and metadata tell.
func (r *Runtime) decode(m jetstream.Msg) decoded {
	ev, err := contract.DecodeEvent(m.Data())
	if err != nil {
		return decoded{code: "undecodable", reason: err}
	}
	if want := r.cfg.SubjectPrefix + contract.SubjectToken(ev.Key); m.Subject() != want {
		return decoded{code: "wrong_subject", reason: fmt.Errorf("event for key %q arrived on %s, want %s", ev.Key, m.Subject(), want)}
	}
	it := &item{msg: m, ev: &ev, repair: m.Headers().Get(contract.HeaderReemission) != ""}
	if meta, err := m.Metadata(); err == nil {
		it.delivered, it.stored = meta.NumDelivered, meta.Timestamp
	}
	if ct, err := time.Parse(time.RFC3339Nano, m.Headers().Get(contract.HeaderCommitTime)); err == nil {
		it.commitTime = ct
	}
	it.trace = m.Headers().Get("traceparent")
	return decoded{it: it}
}
