package projector

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Gaps: a runtime with Config.EveryEvent needs every event, and a stream's
// limits can remove one before it is read: the documents' stream keeps
// only the last few versions of each document (MaxMsgsPerSubject), the
// effects' stream (the notifier's) keeps an event until it is acknowledged
// but no longer than its age limit, and within its size limit. An event
// removed before the runtime read it is never delivered: the server steps
// over it. The runtime sees that as a stream sequence it never received,
// since its filter (converge.docs.> or converge.events.>) is the whole
// stream and every sequence is one of its events.
//
// The rule: the runtime owes itself the sequences after the last one its
// consumer delivered when the runtime (re)starts (ConsumerInfo.Delivered,
// not the acknowledgement floor: acknowledgements above the floor, such as
// the later versions acknowledged while an earlier one waits for a
// [Redeliver], would otherwise read as a gap). A brand-new consumer, or
// one converge replay recreated, has delivered nothing: the server places
// it at the later of its start and the stream's first sequence, so the
// events purged before it existed are not its gap. Any later message
// whose sequence is more than one past the highest seen makes suspects of
// those between; a redelivery (a sequence at or below it) clears one. A
// suspect not delivered within twice the acknowledgement wait is a gap
// (see gapDetector): a message delivered to a pull request the runtime
// never read comes again after that wait, one the limits removed never. The messages the runtime
// hands back unread when it stops are checked too; a crash with messages
// fetched but not yet checked can leave a gap among them unreported.

// GapRecordKey is the key, in the metadata of the runtime's durable
// consumer, of its [GapRecord] (JSON): converge status reads it there.
const GapRecordKey = "converge.gaps"

// GapRecord is what a runtime with Config.EveryEvent keeps of the events
// it never received: their total since its consumer was created (a
// replay keeps it), and the last gap.
type GapRecord struct {
	Missed   uint64    `json:"missed"`
	LastFrom uint64    `json:"last_from"` // first stream sequence of the last gap
	LastTo   uint64    `json:"last_to"`   // and its last
	At       time.Time `json:"at"`        // when the last gap was seen
}

// ReadGapRecord decodes the gap record of a consumer's metadata; false
// when there is none (no gap ever) or it does not decode.
func ReadGapRecord(metadata map[string]string) (GapRecord, bool) {
	raw, ok := metadata[GapRecordKey]
	if !ok {
		return GapRecord{}, false
	}
	var rec GapRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return GapRecord{}, false
	}
	return rec, true
}

// Events delivered and not acknowledged are owed too: the server delivers
// them again (after a nak's delay, or after the acknowledgement wait, or
// at once after a consumer reset), unless the stream's limits removed them
// meanwhile, and then never. The runtime keeps the sequences it handed
// back itself (nak) with the time they are due again; and at every
// (re)start, the consumer's own count of events delivered and not
// acknowledged (ConsumerInfo.NumAckPending, between its acknowledgement
// floor and its last delivered sequence) less those of its own: that
// many of them must come again within the grace. A takeover passes the
// consumer's state read before its reset ([Runtime.TookOver]): the reset
// sends the consumer back to its acknowledgement floor, and on a work
// queue the events acknowledged above the floor are gone from the
// stream, which without that state read as a gap.

// gapDetector follows the stream sequences delivered, in fetch order. A
// sequence stepped over is a suspect, not yet a gap: the server may have
// delivered it to a pull request this runtime never read (a consumer
// leader lost it on a cluster, a connection dropped it as a slow
// consumer), and then delivers it again once its acknowledgement wait
// ends. A suspect still not delivered grace (twice the wait) after it was
// stepped over was removed before this runtime read it: a gap. So is
// every suspect left when the runtime stops, which cannot tell.
type gapDetector struct {
	mu       sync.Mutex
	highest  uint64 // the highest stream sequence seen
	suspects []gapSpan
	grace    time.Duration
	// owed are the sequences this runtime handed back unacknowledged,
	// each with the time by which it must have come again.
	owed map[uint64]time.Time
	// pending is what the consumer had delivered and not acknowledged at
	// the (re)start, less owed.
	pending pendingWindow
	// stream reads the stream's state (see proven); nil: not read.
	stream func(ctx context.Context) (*jetstream.StreamInfo, error)
}

// gapSpan is the stream sequences from..to, stepped over, due to be
// reported at due unless delivered before; unacked: delivered once and
// handed back, then never delivered again.
type gapSpan struct {
	from, to uint64
	due      time.Time
	unacked  bool
	// expected and count, for a span of a pendingWindow: count of the
	// expected events between from and to never came again.
	count uint64
	// window: the span of a pendingWindow.
	window bool
}

// pendingWindow is expected events of stream sequences from..to, delivered
// and not acknowledged when the consumer (re)started, due to come again
// by due; seen are those that did.
type pendingWindow struct {
	from, to uint64
	expected int
	seen     map[uint64]struct{}
	due      time.Time
}

// markOwed records seq, handed back by this runtime, as due again by until
// (plus the grace).
func (g *gapDetector) markOwed(seq uint64, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.owed == nil {
		g.owed = map[uint64]time.Time{}
	}
	g.owed[seq] = until.Add(g.grace)
}

// observe takes the next delivered sequence: a redelivery clears its
// suspicion, a sequence more than one past the highest makes suspects of
// those between.
func (g *gapDetector) observe(seq uint64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.owed[seq]; ok {
		delete(g.owed, seq)
	} else if w := &g.pending; w.expected > 0 && seq > w.from && seq <= w.to {
		w.seen[seq] = struct{}{}
	}
	if seq <= g.highest {
		g.cleared(seq)
		return
	}
	if seq > g.highest+1 {
		g.suspects = append(g.suspects, gapSpan{from: g.highest + 1, to: seq - 1, due: now.Add(g.grace)})
	}
	g.highest = seq
}

// cleared removes seq, delivered again, from the suspects.
func (g *gapDetector) cleared(seq uint64) {
	for i, s := range g.suspects {
		switch {
		case seq < s.from || seq > s.to:
			continue
		case s.from == s.to:
			g.suspects = slices.Delete(g.suspects, i, i+1)
		case seq == s.from:
			g.suspects[i].from++
		case seq == s.to:
			g.suspects[i].to--
		default:
			g.suspects = slices.Insert(g.suspects, i+1, gapSpan{from: seq + 1, to: s.to, due: s.due})
			g.suspects[i].to = seq - 1
		}
		return
	}
}

// due removes and returns the suspects whose time is up at now, or every
// one with all (the runtime stops: it cannot tell them any longer), and
// the owed events whose time is up.
func (g *gapDetector) due(now time.Time, all bool) []gapSpan {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []gapSpan
	keep := g.suspects[:0]
	for _, s := range g.suspects {
		if all || !now.Before(s.due) {
			out = append(out, s)
		} else {
			keep = append(keep, s)
		}
	}
	g.suspects = keep
	// What was handed back and what was pending stay owed past a stop:
	// the consumer delivers them again to the next start, which counts
	// them among its pending.
	for seq, due := range g.owed {
		if !now.Before(due) {
			out = append(out, gapSpan{from: seq, to: seq, due: due, unacked: true, count: 1})
			delete(g.owed, seq)
		}
	}
	if w := &g.pending; w.expected > 0 && !now.Before(w.due) {
		if missing := w.expected - len(w.seen); missing > 0 {
			out = append(out, gapSpan{from: w.from + 1, to: w.to, due: w.due, unacked: true, count: uint64(missing), window: true})
		}
		*w = pendingWindow{}
	}
	slices.SortFunc(out, func(a, b gapSpan) int { return cmp.Compare(a.from, b.from) })
	return out
}

// requeue puts back s, due again at due: a gap not proven yet.
func (g *gapDetector) requeue(s gapSpan, due time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case s.window:
		// Its events have not been seen; the next restart recounts them.
	case s.unacked:
		if g.owed == nil {
			g.owed = map[uint64]time.Time{}
		}
		g.owed[s.from] = due
	default:
		s.due = due
		g.suspects = append(g.suspects, s)
	}
}

// forgetOwed drops the sequences this runtime handed back: a consumer
// state read since counts them among its pending.
func (g *gapDetector) forgetOwed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owed = nil
}

// restart sets the detector at a consumer's (re)start: highest is what the
// consumer has delivered. Suspects and owed sequences stay, since the
// server still owes them, unless the consumer went back (a replay), which
// delivers them again. Of the ackPending events delivered above floor and
// not acknowledged, those not owed already must come again within the
// grace.
func (g *gapDetector) restart(floor, delivered uint64, ackPending int, grace time.Duration, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.grace = grace
	if delivered < g.highest {
		g.suspects, g.owed, g.pending = nil, nil, pendingWindow{}
		g.highest = delivered
		return
	}
	g.highest = delivered
	expected := ackPending
	for seq := range g.owed {
		switch {
		case seq <= floor:
			// Acknowledged since, by whoever held the consumer meanwhile.
			delete(g.owed, seq)
		case seq <= delivered:
			expected--
		}
	}
	g.pending = pendingWindow{}
	if expected > 0 && delivered > floor {
		g.pending = pendingWindow{from: floor, to: delivered, expected: expected, seen: map[uint64]struct{}{}, due: now.Add(grace)}
	}
}

// checkGaps runs the gap detector over msgs (in fetch order, that is
// stream order), then reports the suspects whose time is up. Without
// Config.EveryEvent it does nothing.
func (r *Runtime) checkGaps(ctx context.Context, msgs []jetstream.Msg) {
	if !r.cfg.EveryEvent {
		return
	}
	now := time.Now()
	for _, m := range msgs {
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		r.gaps.observe(meta.Sequence.Stream, now)
	}
	r.reportGaps(ctx, false)
}

// reportGaps counts and logs each suspect whose time is up (with all,
// every one: the runtime stops), and saves the record once if there was
// one.
func (r *Runtime) reportGaps(ctx context.Context, all bool) {
	if !r.cfg.EveryEvent {
		return
	}
	spans := r.gaps.proven(ctx, r.gaps.due(time.Now(), all), all)
	for _, g := range spans {
		from, to := g.from, g.to
		n := to - from + 1
		switch {
		case g.unacked && g.count == 1 && from == to:
			r.log.Error(fmt.Sprintf("the event with stream sequence %d, handed back unacknowledged, was never delivered again: the stream's limits (its per-subject history, age or size) removed it", from),
				"missed", 1, "from", from, "to", to, "stream", r.cfg.Stream)
		case g.unacked:
			n = g.count
			r.log.Error(fmt.Sprintf("%d of the events with stream sequences %d..%d, delivered and not acknowledged before this consumer's (re)start, were never delivered again: the stream's limits (its per-subject history, age or size) removed them", n, from, to),
				"missed", n, "from", from, "to", to, "stream", r.cfg.Stream)
		default:
			r.log.Error(fmt.Sprintf("events with stream sequences %d..%d were never delivered: the stream's limits (its per-subject history, age or size) removed them before this consumer read them", from, to),
				"missed", n, "from", from, "to", to, "stream", r.cfg.Stream)
		}
		r.metrics.Missed.Add(float64(n))
		r.gapMu.Lock()
		r.gapRecord.Missed += n
		r.gapRecord.LastFrom, r.gapRecord.LastTo, r.gapRecord.At = from, to, time.Now().UTC()
		r.gapMu.Unlock()
	}
	if len(spans) > 0 {
		r.saveGapRecord(ctx)
	}
}

// proven keeps of spans, due, those the stream shows gone. On a work
// queue (the effects' stream), the limits remove from its start only, and
// a message not yet acknowledged stays: a span at or above the stream's
// first sequence is still owed (its redelivery is late, as after a
// cluster's leader change) and is put back for the grace. The other
// streams' limits remove from the middle too (a document's history): the
// grace decides there. At a stop (all) every span is kept.
func (g *gapDetector) proven(ctx context.Context, spans []gapSpan, all bool) []gapSpan {
	g.mu.Lock()
	read := g.stream
	g.mu.Unlock()
	if len(spans) == 0 || all || read == nil {
		return spans
	}
	info, err := read(ctx)
	if err != nil || info.Config.Retention != jetstream.WorkQueuePolicy {
		return spans
	}
	first := info.State.FirstSeq
	out := spans[:0]
	for _, s := range spans {
		if s.to < first {
			out = append(out, s)
			continue
		}
		g.requeue(s, time.Now().Add(g.grace))
	}
	return out
}

// startGaps sets the detector at the start of a consumer (see the rule
// above) and takes up the record its metadata holds.
func (r *Runtime) startGaps(info *jetstream.ConsumerInfo) {
	if !r.cfg.EveryEvent || info == nil {
		return
	}
	state := info
	if prev := r.tookOver.Swap(nil); prev != nil && prev.Delivered.Stream > info.Delivered.Stream {
		// The consumer was reset to its floor by a takeover: prev counts
		// what this runtime handed back in an earlier term too, and the
		// reset delivers it again at once.
		state = prev
		r.gaps.forgetOwed()
	}
	r.gaps.mu.Lock()
	r.gaps.stream = func(ctx context.Context) (*jetstream.StreamInfo, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := r.js.Stream(ctx, r.cfg.Stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo(), nil
	}
	r.gaps.mu.Unlock()
	r.gaps.restart(state.AckFloor.Stream, state.Delivered.Stream, state.NumAckPending, 2*r.cfg.AckWait, time.Now())
	if stored, ok := ReadGapRecord(info.Config.Metadata); ok {
		r.gapMu.Lock()
		if stored.Missed >= r.gapRecord.Missed {
			r.gapRecord = stored
		}
		r.gapMu.Unlock()
	}
}

// TookOver gives the runtime the state its consumer had before a takeover
// reset it to its acknowledgement floor (see RunService): the next start
// owes itself what that state says was delivered and not acknowledged,
// and nothing below its last delivered sequence is a gap.
func (r *Runtime) TookOver(prev *jetstream.ConsumerInfo) { r.tookOver.Store(prev) }

// owe records the sequence of a message handed back with delay: due again
// by then.
func (r *Runtime) owe(m jetstream.Msg, delay time.Duration) {
	if !r.cfg.EveryEvent {
		return
	}
	if meta, err := m.Metadata(); err == nil {
		r.gaps.markOwed(meta.Sequence.Stream, time.Now().Add(delay))
	}
}

// LastGap returns the runtime's gap record; Missed 0: no gap seen.
func (r *Runtime) LastGap() GapRecord {
	r.gapMu.Lock()
	defer r.gapMu.Unlock()
	return r.gapRecord
}

// saveGapRecord writes the record into the consumer's metadata, with the
// rest of the consumer's configuration as it is now (a replay may have
// changed its start). A failure is logged: the record stays in memory and
// the next save carries it.
func (r *Runtime) saveGapRecord(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	rec := r.LastGap()
	raw, err := json.Marshal(rec)
	if err != nil {
		r.log.Warn("gap record not saved", "err", err)
		return
	}
	cons, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Name)
	if err == nil {
		cfg := cons.CachedInfo().Config
		cfg.Metadata = maps.Clone(cfg.Metadata)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[GapRecordKey] = string(raw)
		_, err = r.js.UpdateConsumer(ctx, r.cfg.Stream, cfg)
	}
	if err != nil {
		r.log.Warn("gap record not saved in the consumer's metadata; it is kept for the next save", "missed", rec.Missed, "err", err)
	}
}
