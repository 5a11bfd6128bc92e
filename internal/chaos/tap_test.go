//go:build linux

package chaos

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// tap reads every message a stream stores while it is stored, as the
// suite's own user with an ordered consumer: the stream's per-subject
// limits purge a document's older messages within seconds, so the
// duplicates the stream stored over a run can only be counted as they
// come. A message purged before the tap read it (while NATS restarted, or
// the tap lagged) shows as a gap in the sequences: counted, not seen.
type tap struct {
	mu     sync.Mutex
	msgs   []stored
	last   uint64
	missed uint64 // sequences never read
	errs   int
}

// startTap taps stream until ctx ends; the returned function waits until
// it has stopped.
func (p *pipeline) startTap(ctx context.Context, stream string) (*tap, func()) {
	t := &tap{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			t.run(ctx, p.js, stream)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	return t, wg.Wait
}

// run consumes from the sequence after the last one read until ctx ends
// or the consumer fails.
func (t *tap) run(ctx context.Context, js jetstream.JetStream, stream string) {
	t.mu.Lock()
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if t.last > 0 {
		cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: t.last + 1}
	}
	t.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := js.OrderedConsumer(cctx, stream, cfg)
	cancel()
	if err != nil {
		t.failed()
		return
	}
	it, err := c.Messages()
	if err != nil {
		t.failed()
		return
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			t.failed()
			it.Stop()
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		t.mu.Lock()
		seq := md.Sequence.Stream
		if seq > t.last {
			t.missed += seq - t.last - 1
			t.last = seq
			t.msgs = append(t.msgs, stored{Seq: seq, MsgID: m.Headers().Get(jetstream.MsgIDHeader), At: md.Timestamp})
		}
		t.mu.Unlock()
	}
}

func (t *tap) failed() {
	t.mu.Lock()
	t.errs++
	t.mu.Unlock()
}

// seen is what the tap read, and the sequences it never read.
func (t *tap) seen() ([]stored, uint64, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]stored(nil), t.msgs...), t.last, t.missed
}
