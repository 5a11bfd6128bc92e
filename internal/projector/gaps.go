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

	"github.com/converge-sync/converge/pkg/contract"
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
	// RemovalsNext is the first record of the removals' stream whose
	// event is not known to be accounted for, and Resolved the last events
	// accounted for (reported, or finished by the store); see removals.go.
	RemovalsNext uint64   `json:"removals_next,omitempty"`
	Resolved     []uint64 `json:"resolved,omitempty"`
	// Suspects are the sequences the runtime had stepped over and not yet
	// reported at the last save: a start after a crash (no hand-over)
	// suspects them again. Kept where the runtime reads a removals'
	// stream.
	Suspects [][2]uint64 `json:"suspects,omitempty"`
	// Seen is the highest stream sequence the runtime had seen when it
	// last acknowledged: every later one delivered by then was neither
	// acknowledged nor reported. Saved, where the runtime reads a
	// removals' stream and while the stream is near its limits (only then
	// can the limits remove an event before it is delivered), before the
	// acknowledgements of a batch that raises it; 0 while the stream is
	// far from them (see saveSeen).
	Seen uint64 `json:"seen,omitempty"`
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
// meanwhile, and then never: the server counts such a removal as an
// acknowledgement (the floor moves past it, NumAckPending drops it). The
// runtime keeps the sequences it handed back itself (nak, and the
// messages it releases unread when a consume ends) with the time they are
// due again, and their events. Due and, on a work queue, shown gone by the
// stream's first sequence, one is reported once every message the
// consumer had delivered by then has been seen (a copy delivered before
// the event went may still be in hand, buffered in the client or fetched
// ahead, and is handled when seen), unless the store finished its event
// meanwhile (a [Finisher]: the notifier's send that outlasted its wait). A stale copy (a message delivered again after its
// acknowledgement wait while the first copy was in hand) handed back
// after the runtime acknowledged or reported its sequence is not owed.
//
// Across a restart:
//
//   - Within one Run (a consume that ends on an error and starts again),
//     the runtime goes on from what it knows: its owed sequences and
//     suspects stay, and the sequences delivered since the highest it saw,
//     to pull requests it never read, are owed too (see resume). Nothing
//     else is pending, so no count is taken.
//   - When Run ends on a work queue whose state it can read (not fenced),
//     the runtime reports what the stream shows gone and writes the rest,
//     with the consumer's last delivered sequence, into the consumer's
//     metadata ([gapHandover]). The next start takes it (deleting it
//     first, so that it is taken once) and knows the same: what it owes is
//     exact, even if the limits remove some of it before that start.
//   - Otherwise (the first start, a start after a crash, after a hand-over
//     that could not be written or taken, or on another stream) the
//     runtime counts, at the (re)start, the consumer's events delivered and
//     not acknowledged (ConsumerInfo.NumAckPending, between its floor and
//     its last delivered sequence) less those it owes itself: that many of
//     them must come again within the grace. A takeover passes the
//     consumer's state read before its reset ([Runtime.TookOver]): the
//     reset sends the consumer back to its floor, and on a work queue the
//     events acknowledged above the floor are gone from the stream, which
//     without that state read as a gap.
//
// What remains unreported: after a runtime dies (killed, cut off from
// NATS as it stops, fenced) there is no hand-over, and an event that was
// delivered to it and not acknowledged (handed back for a backoff, in
// hand, or buffered in its client) and that the limits removed before the
// next start read the consumer's state is counted nowhere. Neither that
// state nor the stream's tells it from an event acknowledged: on a work
// queue both leave the stream, and the server counts the removal as an
// acknowledgement. With a removals' stream (Config.Removals) the server's
// record of each such removal closes this window: see removals.go.
// Likewise, if the stop cannot read the stream's or the
// consumer's state, the suspects are reported as at any stop (some may be
// late redeliveries) and the owed sequences are left to the next start's
// count. And the store's word (Finisher) is taken only while the runtime
// knows the event and within the store's own bound (the notifier waits
// for a send in flight up to its claim timeout): a send that outlasts
// that, and then succeeds, has its event reported missed if the limits
// removed it meanwhile.

// gapDetector follows the stream sequences delivered, in fetch order. A
// sequence stepped over is a suspect, not yet a gap: the server may have
// delivered it to a pull request this runtime never read (a consumer
// leader lost it on a cluster, a connection dropped it as a slow
// consumer), and then delivers it again once its acknowledgement wait
// ends. A suspect still not delivered grace (twice the wait) after it was
// stepped over was removed before this runtime read it: a gap (on a work
// queue, once the stream's first sequence is past it). When the runtime
// stops, the suspects are settled as stopGaps says.
type gapDetector struct {
	mu       sync.Mutex
	highest  uint64 // the highest stream sequence seen
	suspects []gapSpan
	grace    time.Duration
	// owed are the sequences this runtime handed back unacknowledged,
	// each with the time by which it must have come again.
	owed map[uint64]owedEvent
	// settled are the last sequences this runtime acknowledged (applied
	// or dead-lettered) or reported: a stale copy of one (delivered again
	// after its acknowledgement wait while another copy was in hand) is
	// not owed when handed back. Such copies are among the messages in
	// hand, so the last few times MaxAckPending suffice.
	settled recentSeqs
	// pending is what the consumer had delivered and not acknowledged at
	// the (re)start, less owed.
	pending pendingWindow
	// stream reads the stream's state (see proven); nil: not read.
	stream func(ctx context.Context) (*jetstream.StreamInfo, error)
	// consumer reads the consumer's state (see proven); nil: not read.
	consumer func(ctx context.Context) (*jetstream.ConsumerInfo, error)
	// seenDelivery is the highest consumer sequence (the count of
	// deliveries, redeliveries included) of a message seen.
	seenDelivery uint64
	// changed: the suspects changed since the gap record was saved.
	changed bool
	// removals: the runtime reads a removals' stream, which tells the
	// events delivered before a crash and removed since (no pending
	// window is counted).
	removals bool
	// observed are the last sequences seen (redeliveries included), and
	// startDelivered the consumer's last delivery when it started: a
	// removal record of a sequence up to it that this runtime never saw
	// is reported from the record (see removals.go).
	observed       recentSeqs
	startDelivered uint64
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
	// handed: owed across a restart of the consumer (see resume):
	// delivered and not acknowledged, or stepped over, before it.
	handed bool
	// ev is the event of an owed sequence (unacked, count 1), when known.
	ev *contract.Event
	// pending is the window of a window span, put back whole if its
	// time is not up (see requeue).
	pending *pendingWindow
	// after, once the span is proven gone: it is reported when a
	// delivery numbered after or later was seen (every copy of it that
	// was in hand then has been seen), or at due; see proven.
	after uint64
	// gone: proven gone, reported without another look at the stream.
	gone bool
	// removed: an event of a record of the removals' stream that no
	// runtime accounted for; lostRecords: records of that stream its own
	// limits removed unread, one event each.
	removed, lostRecords bool
}

// owedEvent is a sequence handed back: due again by due, with its event
// when known.
type owedEvent struct {
	due   time.Time
	ev    *contract.Event
	after uint64 // see gapSpan.after
}

// pendingWindow is expected events of stream sequences from..to, delivered
// and not acknowledged when the consumer (re)started, due to come again
// by due; seen are those that did.
type pendingWindow struct {
	from, to uint64
	expected int
	seen     map[uint64]struct{}
	due      time.Time
	after    uint64 // see gapSpan.after
}

// markOwed records seq, of the event ev (nil: unknown), handed back by
// this runtime, as due again by until (plus the grace).
func (g *gapDetector) markOwed(seq uint64, ev *contract.Event, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.settled.has(seq) {
		return
	}
	if g.owed == nil {
		g.owed = map[uint64]owedEvent{}
	}
	g.owed[seq] = owedEvent{due: until.Add(g.grace), ev: ev}
}

// settle records seq as acknowledged by this runtime: owed no longer,
// nor when a stale copy of it is handed back.
func (g *gapDetector) settle(seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.owed, seq)
	g.settled.add(seq)
}

// recentSeqs is a set of the last sequences added, at most its size (0:
// defaultRecent).
type recentSeqs struct {
	size  int
	set   map[uint64]struct{}
	order []uint64 // a ring, next the oldest once full
	next  int
}

const defaultRecent = 4096

func (s *recentSeqs) has(seq uint64) bool {
	_, ok := s.set[seq]
	return ok
}

func (s *recentSeqs) add(seq uint64) {
	if s.has(seq) {
		return
	}
	if s.set == nil {
		if s.size <= 0 {
			s.size = defaultRecent
		}
		s.set = map[uint64]struct{}{}
	}
	if len(s.order) < s.size {
		s.order = append(s.order, seq)
	} else {
		delete(s.set, s.order[s.next])
		s.order[s.next] = seq
		s.next = (s.next + 1) % s.size
	}
	s.set[seq] = struct{}{}
}

// reported records the sequences of spans, reported missed, as settled:
// a stale copy of one of them handed back is not owed again. (A span of
// events never delivered has no copy; one too long to be copies of
// messages in hand is left out.)
func (g *gapDetector) reported(spans []gapSpan) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range spans {
		if (!s.unacked && !s.handed) || s.window || s.to-s.from >= uint64(defaultRecent) {
			continue
		}
		for seq := s.from; seq <= s.to; seq++ {
			g.settled.add(seq)
		}
	}
}

// observe takes the next delivered sequence: a redelivery clears its
// suspicion, a sequence more than one past the highest makes suspects of
// those between.
func (g *gapDetector) observe(seq uint64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.observed.add(seq)
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
		g.changed = true
	}
	g.highest = seq
}

// cleared removes seq, delivered again, from the suspects.
func (g *gapDetector) cleared(seq uint64) {
	for i, s := range g.suspects {
		if seq >= s.from && seq <= s.to {
			g.changed = true
		}
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
			after := s
			after.from = seq + 1
			g.suspects = slices.Insert(g.suspects, i+1, after)
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
	ready := func(due time.Time, after uint64) bool {
		return !now.Before(due) || (after > 0 && g.seenDelivery >= after)
	}
	keep := g.suspects[:0]
	for _, s := range g.suspects {
		if all || ready(s.due, s.after) {
			s.gone = s.after > 0
			out = append(out, s)
		} else {
			keep = append(keep, s)
		}
	}
	g.suspects = keep
	// What was handed back and what was pending stay owed past a stop:
	// the consumer delivers them again to the next start, to which
	// stopGaps hands them over (or which counts them among its pending).
	for seq, o := range g.owed {
		if ready(o.due, o.after) {
			out = append(out, gapSpan{from: seq, to: seq, due: o.due, unacked: true, count: 1, ev: o.ev, gone: o.after > 0})
			delete(g.owed, seq)
		}
	}
	if w := g.pending; w.expected > 0 && ready(w.due, w.after) {
		if missing := w.expected - len(w.seen); missing > 0 {
			out = append(out, gapSpan{from: w.from + 1, to: w.to, due: w.due, unacked: true, count: uint64(missing), window: true, pending: &w, gone: w.after > 0})
		}
		g.pending = pendingWindow{}
	}
	slices.SortFunc(out, func(a, b gapSpan) int { return cmp.Compare(a.from, b.from) })
	return out
}

// requeue puts back s, due again at due: a gap not proven yet, or (after
// > 0) proven gone and waiting for the deliveries up to after to be seen.
func (g *gapDetector) requeue(s gapSpan, due time.Time, after uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case s.window:
		// Unless a restart opened another window meanwhile, which counts
		// them again.
		if g.pending.expected == 0 && s.pending != nil {
			g.pending = *s.pending
			g.pending.due, g.pending.after = due, after
		}
	case s.unacked:
		if g.owed == nil {
			g.owed = map[uint64]owedEvent{}
		}
		g.owed[s.from] = owedEvent{due: due, ev: s.ev, after: after}
	default:
		s.due, s.after = due, after
		g.suspects = append(g.suspects, s)
	}
}

// sawDelivery records the consumer sequence of a message seen.
func (g *gapDetector) sawDelivery(dseq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seenDelivery = max(g.seenDelivery, dseq)
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
	if expected > 0 && delivered > floor && !g.removals {
		g.pending = pendingWindow{from: floor, to: delivered, expected: expected, seen: map[uint64]struct{}{}, due: now.Add(grace)}
	}
}

// resume sets the detector at a consumer's (re)start when what it owes
// itself is known exactly: every event delivered to this runtime (or to
// the one that stopped before it) and neither acknowledged nor reported
// is among the suspects and owed sequences, and held adds those a stopped
// runtime handed over (see [gapHandover]). since is the last sequence
// delivered that this knowledge covers: the ones delivered after it, up to
// delivered, went to pull requests nobody read, or were stepped over, and
// are owed too. Nothing else is pending, so no window is opened, and an
// owed sequence below the floor was removed by the stream's limits (the
// server counts such a removal as an acknowledgement), not acknowledged:
// it stays owed, and is reported once its time is up and the stream shows
// it gone. A consumer that went back (a replay) owes nothing.
func (g *gapDetector) resume(held []gapSpan, window pendingWindow, since, delivered uint64, grace time.Duration, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.grace = grace
	if delivered < since {
		g.suspects, g.owed, g.pending = nil, nil, pendingWindow{}
		g.highest = delivered
		return
	}
	for _, h := range held {
		h.due, h.handed = now.Add(grace), true
		g.suspects = append(g.suspects, h)
	}
	if delivered > since {
		g.suspects = append(g.suspects, gapSpan{from: since + 1, to: delivered, due: now.Add(grace), handed: true})
	}
	if window.expected > 0 {
		window.due = now.Add(grace)
		g.pending = window
	}
	g.highest = delivered
}

// handOver empties the detector when the runtime stops on a work queue
// whose first sequence is first (0: not read, nothing is proven gone): the
// suspects and owed sequences below it are gone (returned to be
// reported), the others are still in the stream, delivered and not
// acknowledged, and are held for the next start, with the open pending
// window; delivered is the consumer's last delivered sequence, above what
// this runtime saw (pull requests it never read).
func (g *gapDetector) handOver(first, delivered uint64) (gone, held []gapSpan, window pendingWindow) {
	g.mu.Lock()
	defer g.mu.Unlock()
	all := slices.Clone(g.suspects)
	for seq, o := range g.owed {
		all = append(all, gapSpan{from: seq, to: seq, unacked: true, count: 1, ev: o.ev})
	}
	if delivered > g.highest {
		all = append(all, gapSpan{from: g.highest + 1, to: delivered, handed: true})
	}
	for _, s := range all {
		if s.from < first {
			below := s
			below.to = min(s.to, first-1)
			if below.unacked {
				below.count = below.to - below.from + 1
			}
			gone = append(gone, below)
		}
		if s.to >= first {
			s.from = max(s.from, first)
			held = append(held, s)
		}
	}
	window = g.pending
	g.suspects, g.owed, g.pending = nil, nil, pendingWindow{}
	g.highest = max(g.highest, delivered)
	slices.SortFunc(gone, func(a, b gapSpan) int { return cmp.Compare(a.from, b.from) })
	slices.SortFunc(held, func(a, b gapSpan) int { return cmp.Compare(a.from, b.from) })
	return gone, held, window
}

// gapHandoverKey is the key, in the metadata of the runtime's durable
// consumer, of the [gapHandover] (JSON) a runtime that stopped leaves to
// the next start.
const gapHandoverKey = "converge.owed"

// gapHandover is what a runtime on a work queue owes itself when it stops
// cleanly: Owed, the spans of stream sequences delivered (or stepped over)
// and neither acknowledged nor reported, all still in the stream then;
// Delivered, the consumer's last delivered sequence then; and its open
// pending window. The next start takes it over and deletes it from the
// metadata before it relies on it, so that no later start takes it again
// after this one acknowledged some of it.
type gapHandover struct {
	Delivered uint64        `json:"delivered"`
	Owed      [][2]uint64   `json:"owed,omitempty"`
	Window    *handedWindow `json:"window,omitempty"`
}

// handedWindow is a pendingWindow in a gapHandover.
type handedWindow struct {
	From     uint64   `json:"from"`
	To       uint64   `json:"to"`
	Expected int      `json:"expected"`
	Seen     []uint64 `json:"seen,omitempty"`
}

// newGapHandover is the hand-over of held and w at delivered, adjacent
// spans merged.
func newGapHandover(delivered uint64, held []gapSpan, w pendingWindow) *gapHandover {
	h := &gapHandover{Delivered: delivered}
	for _, s := range held {
		if n := len(h.Owed); n > 0 && h.Owed[n-1][1]+1 >= s.from {
			h.Owed[n-1][1] = max(h.Owed[n-1][1], s.to)
			continue
		}
		h.Owed = append(h.Owed, [2]uint64{s.from, s.to})
	}
	if w.expected > 0 {
		h.Window = &handedWindow{From: w.from, To: w.to, Expected: w.expected, Seen: slices.Sorted(maps.Keys(w.seen))}
	}
	return h
}

// readGapHandover decodes the hand-over in a consumer's metadata; false
// when there is none.
func readGapHandover(metadata map[string]string) (*gapHandover, bool) {
	raw, ok := metadata[gapHandoverKey]
	if !ok {
		return nil, false
	}
	var h gapHandover
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		return nil, false
	}
	return &h, true
}

// held and window are the hand-over as the detector takes it.
func (h *gapHandover) held() ([]gapSpan, pendingWindow) {
	var spans []gapSpan
	for _, o := range h.Owed {
		spans = append(spans, gapSpan{from: o[0], to: o[1]})
	}
	var w pendingWindow
	if h.Window != nil && h.Window.Expected > 0 {
		w = pendingWindow{from: h.Window.From, to: h.Window.To, expected: h.Window.Expected, seen: map[uint64]struct{}{}}
		for _, seq := range h.Window.Seen {
			w.seen[seq] = struct{}{}
		}
	}
	return spans, w
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
		r.gaps.sawDelivery(meta.Sequence.Consumer)
	}
	r.reportGaps(ctx, false)
}

// reportGaps counts and logs each suspect whose time is up (with all,
// every one: the runtime stops), and saves the record once if there was
// one.
func (r *Runtime) reportGaps(ctx context.Context, all bool) {
	if !r.cfg.EveryEvent || ctx.Err() != nil {
		// Stopping: stopGaps settles what is due, with the stream's state.
		return
	}
	ctx = context.WithoutCancel(ctx) // what is taken out of the detector is settled
	spans := r.unfinished(ctx, r.gaps.proven(ctx, r.gaps.due(time.Now(), all), all))
	// The removal records first (at once when something is due): a
	// sequence stepped over that has one was delivered, and is reported
	// from there, not again as stepped over.
	moved := r.followRemovals(ctx, len(spans) > 0)
	spans = r.withoutResolved(spans)
	r.report(spans)
	if len(spans) > 0 || moved || (r.removals.open() && r.gaps.suspectsChanged()) {
		if err := r.saveGapRecord(ctx, nil); err != nil {
			r.log.Warn("gap record not saved in the consumer's metadata; it is kept for the next save", "missed", r.LastGap().Missed, "err", err)
		}
	}
}

// report counts and logs spans, events never received.
func (r *Runtime) report(spans []gapSpan) {
	r.gaps.reported(spans)
	for _, g := range spans {
		from, to := g.from, g.to
		n := to - from + 1
		switch {
		case g.lostRecords:
			n = g.count
		case g.removed:
			r.log.Error(fmt.Sprintf("the event with stream sequence %d, delivered and not acknowledged, was removed by the stream's limits while no runtime of this consumer accounted for it (one had stopped without handing it over): the server's record of the removal is in %s", from, r.cfg.Removals),
				"missed", 1, "from", from, "to", to, "stream", r.cfg.Stream)
		case g.unacked && g.count == 1 && from == to:
			r.log.Error(fmt.Sprintf("the event with stream sequence %d, handed back unacknowledged, was never delivered again: the stream's limits (its per-subject history, age or size) removed it", from),
				"missed", 1, "from", from, "to", to, "stream", r.cfg.Stream)
		case g.handed:
			r.log.Error(fmt.Sprintf("events with stream sequences %d..%d, owed to this consumer across its restart (delivered and not acknowledged, or stepped over), were never delivered again: the stream's limits (its per-subject history, age or size) removed them", from, to),
				"missed", n, "from", from, "to", to, "stream", r.cfg.Stream)
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
		r.gapRecord.LastFrom, r.gapRecord.LastTo, r.gapRecord.At = from, to, r.cfg.Clock.Now().UTC()
		r.gapMu.Unlock()
		r.resolve(g.accounted()...)
	}
}

// accounted are the sequences a report of s accounts for: a removal record
// of one of them is passed over. A window's are those not seen again;
// records lost and very long spans (events never delivered, which have no
// record) name none.
func (s gapSpan) accounted() []uint64 {
	if s.lostRecords || s.to-s.from >= uint64(resolvedMax) {
		return nil
	}
	var seqs []uint64
	for seq := s.from; seq <= s.to; seq++ {
		if s.pending != nil {
			if _, seen := s.pending.seen[seq]; seen {
				continue
			}
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

// stopGaps settles the detector when Run ends. A runtime that was the
// writer to the end reports what the stream shows gone and hands the rest
// over to the next start (see [gapHandover]), which then knows exactly
// what it owes itself, even if the stream's limits remove some of it
// meanwhile: on a work queue whose state it can read, or on any stream
// when it owes nothing. Otherwise every suspect is reported: it cannot
// tell them any longer.
func (r *Runtime) stopGaps(ctx context.Context) {
	if !r.cfg.EveryEvent {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if r.runConsumed && r.fenced.Load() == nil && r.handOver(ctx) {
		return
	}
	r.reportGaps(ctx, true)
}

// handOver does stopGaps' hand-over; false when the consumer's state
// cannot be read, or the detector holds something to prove and the stream
// is no work queue or its state cannot be read. (A detector that holds
// nothing hands over without reading the stream, which the notifier may
// not do on the documents' stream.)
func (r *Runtime) handOver(ctx context.Context) bool {
	r.gaps.mu.Lock()
	read := r.gaps.stream
	holds := len(r.gaps.suspects) > 0 || len(r.gaps.owed) > 0 || r.gaps.pending.expected > 0
	r.gaps.mu.Unlock()
	if read == nil {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := r.js.Consumer(cctx, r.cfg.Stream, r.cfg.Name)
	if err != nil {
		return false
	}
	delivered := cons.CachedInfo().Delivered.Stream
	first := uint64(0) // nothing is proven gone
	if holds {
		info, err := read(ctx)
		if err != nil || info.Config.Retention != jetstream.WorkQueuePolicy {
			return false
		}
		first = info.State.FirstSeq
	}
	gone, held, window := r.gaps.handOver(first, delivered)
	r.followRemovals(ctx, true)
	r.report(r.withoutResolved(r.unfinished(ctx, gone)))
	held = r.unfinished(ctx, held)
	if err := r.saveGapRecord(ctx, newGapHandover(delivered, held, window)); err != nil {
		r.log.Error("what this consumer was delivered and had not acknowledged could not be handed over to its next start: an event of it the stream's limits remove before then will not be reported",
			"owed_spans", len(held), "err", err)
	}
	return true
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
	read, readConsumer, seen := g.stream, g.consumer, g.seenDelivery
	g.mu.Unlock()
	if len(spans) == 0 || all || read == nil {
		return spans
	}
	var info *jetstream.StreamInfo
	out := spans[:0]
	var delivered uint64 // the consumer's deliveries now; 0: not read
	for _, s := range spans {
		if s.gone {
			out = append(out, s)
			continue
		}
		if info == nil {
			var err error
			if info, err = read(ctx); err != nil || info.Config.Retention != jetstream.WorkQueuePolicy {
				return append(out, spans[len(out):]...)
			}
		}
		if s.to >= info.State.FirstSeq {
			g.requeue(s, time.Now().Add(g.grace), 0)
			continue
		}
		// Gone from the stream; but a copy delivered before it went may
		// still be in hand (buffered, or in the batch fetched ahead), to
		// be seen and handled. Once every delivery made until now has been
		// seen, none is.
		if delivered == 0 && readConsumer != nil {
			if c, err := readConsumer(ctx); err == nil {
				delivered = c.Delivered.Consumer
			}
		}
		if delivered > seen {
			g.requeue(s, time.Now().Add(g.grace), delivered)
			continue
		}
		out = append(out, s)
	}
	return out
}

// startGaps sets the detector at the start of a consumer (see the rule
// above) and takes up the record its metadata holds.
func (r *Runtime) startGaps(ctx context.Context, info *jetstream.ConsumerInfo) {
	if !r.cfg.EveryEvent || info == nil {
		return
	}
	continuing := r.runConsumed
	r.runConsumed = true
	state := info
	if prev := r.tookOver.Swap(nil); prev != nil && prev.Delivered.Stream > info.Delivered.Stream {
		// The consumer was reset to its floor by a takeover: prev counts
		// what this runtime handed back in an earlier term too, and the
		// reset delivers it again at once.
		state = prev
		r.gaps.forgetOwed()
	}
	r.gaps.mu.Lock()
	if r.gaps.settled.size == 0 {
		r.gaps.settled.size = max(defaultRecent, 8*4*r.cfg.BatchSize) // 8 times MaxAckPending
	}
	r.gaps.stream = func(ctx context.Context) (*jetstream.StreamInfo, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := r.js.Stream(ctx, r.cfg.Stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo(), nil
	}
	r.gaps.consumer = func(ctx context.Context) (*jetstream.ConsumerInfo, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Name)
		if err != nil {
			return nil, err
		}
		return c.CachedInfo(), nil
	}
	r.gaps.mu.Unlock()
	if stored, ok := ReadGapRecord(info.Config.Metadata); ok {
		r.gapMu.Lock()
		if stored.Missed >= r.gapRecord.Missed {
			r.gapRecord = stored
		}
		r.gapMu.Unlock()
	}
	grace, now := 2*r.cfg.AckWait, time.Now()
	handedOver := false
	if !continuing && r.openRemovals(ctx) {
		r.gaps.mu.Lock()
		r.gaps.removals = true
		r.gaps.mu.Unlock()
		// What the runtime before left unaccounted for (after a crash),
		// reported once the detector is set.
		defer func() { r.takeRemovals(ctx, handedOver, state.Delivered.Stream) }()
	}
	if h, ok := readGapHandover(info.Config.Metadata); ok {
		// Taken once: deleted before it is relied on.
		err := r.saveGapRecord(ctx, nil)
		handedOver = err == nil
		if err == nil {
			held, window := h.held()
			r.gaps.mu.Lock()
			r.gaps.suspects, r.gaps.owed, r.gaps.pending = nil, nil, pendingWindow{}
			r.gaps.mu.Unlock()
			r.gaps.resume(held, window, h.Delivered, state.Delivered.Stream, grace, now)
			return
		}
		r.log.Warn("the hand-over of the last stop could not be taken (deleted from the consumer's metadata); counting what is pending instead", "err", err)
	}
	if continuing {
		// A restart within one Run: nobody else consumed meanwhile.
		r.gaps.mu.Lock()
		since := r.gaps.highest
		r.gaps.mu.Unlock()
		r.gaps.resume(nil, pendingWindow{}, since, state.Delivered.Stream, grace, now)
		return
	}
	r.gaps.restart(state.AckFloor.Stream, state.Delivered.Stream, state.NumAckPending, grace, now)
}

// suspectSpans returns the suspects to save (see GapRecord.Suspects) and
// marks them saved.
func (g *gapDetector) suspectSpans() [][2]uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.changed = false
	var out [][2]uint64
	for _, s := range g.suspects {
		if !s.unacked && !s.window {
			out = append(out, [2]uint64{s.from, s.to})
		}
	}
	return out
}

// suspectsChanged reports whether the suspects changed since the last
// save.
func (g *gapDetector) suspectsChanged() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// takeRemovals reports, at a consumer's start, what the removals' stream
// shows the runtime before left unaccounted for (see startRemovals), and
// saves the count with the new position.
func (r *Runtime) takeRemovals(ctx context.Context, handedOver bool, delivered uint64) {
	r.report(r.startRemovals(ctx, handedOver, delivered))
	if err := r.saveGapRecord(ctx, nil); err != nil {
		r.log.Warn("gap record not saved in the consumer's metadata; it is kept for the next save", "missed", r.LastGap().Missed, "err", err)
	}
}

// TookOver gives the runtime the state its consumer had before a takeover
// reset it to its acknowledgement floor (see RunService): the next start
// owes itself what that state says was delivered and not acknowledged,
// and nothing below its last delivered sequence is a gap.
func (r *Runtime) TookOver(prev *jetstream.ConsumerInfo) { r.tookOver.Store(prev) }

// settle records the sequence of m, acknowledged (see gapDetector.settle).
func (r *Runtime) settle(m jetstream.Msg) {
	if !r.cfg.EveryEvent {
		return
	}
	if meta, err := m.Metadata(); err == nil {
		r.gaps.settle(meta.Sequence.Stream)
	}
}

// owe records the sequence of a message handed back with delay, of the
// event ev (nil: not decoded): due again by then.
func (r *Runtime) owe(m jetstream.Msg, ev *contract.Event, delay time.Duration) {
	if !r.cfg.EveryEvent {
		return
	}
	if meta, err := m.Metadata(); err == nil {
		r.gaps.markOwed(meta.Sequence.Stream, ev, time.Now().Add(delay))
	}
}

// Finisher is a [Store] that may finish an event after it asked for its
// redelivery: the notifier, whose send outlasting its wait goes on in the
// background. An event handed back that way and then removed by the
// stream's limits is no loss once the store finished it, and is not
// reported missed.
type Finisher interface {
	Store
	// Finished reports whether the store has done all that ev asks of
	// it; false when it cannot tell.
	Finished(ctx context.Context, ev *contract.Event) bool
}

// unfinished drops from spans the events handed back that the store
// finished since (see [Finisher]).
func (r *Runtime) unfinished(ctx context.Context, spans []gapSpan) []gapSpan {
	f, ok := r.store.(Finisher)
	if !ok {
		return spans
	}
	out := spans[:0]
	for _, s := range spans {
		if s.ev != nil && f.Finished(ctx, s.ev) {
			r.log.Info("an event handed back and then removed by the stream's limits was finished meanwhile: no loss",
				"seq", s.from, "key", s.ev.Key, "version", s.ev.Version)
			r.resolve(s.from)
			continue
		}
		out = append(out, s)
	}
	return out
}

// LastGap returns the runtime's gap record; Missed 0: no gap seen.
func (r *Runtime) LastGap() GapRecord {
	r.gapMu.Lock()
	defer r.gapMu.Unlock()
	rec := r.gapRecord
	rec.Resolved = slices.Clone(rec.Resolved)
	return rec
}

// saveGapRecord writes the record into the consumer's metadata, with the
// rest of the consumer's configuration as it is now (a replay may have
// changed its start), and the hand-over h (nil: none, deleting one that
// is there). On an error the record stays in memory and the next save
// carries it.
func (r *Runtime) saveGapRecord(ctx context.Context, h *gapHandover) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r.saveMu.Lock() // the last save writes the latest record
	defer r.saveMu.Unlock()
	rec := r.LastGap()
	if r.removals.open() {
		rec.Suspects = r.gaps.suspectSpans()
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	var handover []byte
	if h != nil {
		if handover, err = json.Marshal(h); err != nil {
			return err
		}
	}
	cons, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Name)
	if err != nil {
		return err
	}
	cfg := cons.CachedInfo().Config
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	if rec.Missed > 0 || rec.RemovalsNext > 0 { // no record without a gap or a position
		cfg.Metadata[GapRecordKey] = string(raw)
	}
	delete(cfg.Metadata, gapHandoverKey)
	if h != nil {
		cfg.Metadata[gapHandoverKey] = string(handover)
	}
	_, err = r.js.UpdateConsumer(ctx, r.cfg.Stream, cfg)
	return err
}
