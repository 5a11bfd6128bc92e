package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Removals: on a work queue the server counts an event its limits removed
// while a consumer held it delivered and unacknowledged as acknowledged,
// and neither the stream's state nor the consumer's tells it from one
// acknowledged. A running runtime knows what it holds and reports such an
// event itself (see gaps.go); but a runtime killed, or cut off as it
// stops, leaves no hand-over, and an event it held that the limits remove
// before the next start reads the consumer's state was counted nowhere.
// The server announces each such removal as it happens, whether or not a
// consumer runs: the advisory
// $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer> with a
// limits reason. The removals' stream (Config.Removals; the relay creates
// contract.RemovalsStream with the effects' stream) keeps them.
//
// The records close that window. A running runtime reads them as they
// come and moves its position in them (GapRecord.RemovalsNext) past each
// record whose event it has accounted for: acknowledged, reported missed,
// or finished by the store; the gap record keeps the last events it
// accounted that way (GapRecord.Resolved) with its count. A start that
// takes no hand-over (after a crash, or the first) reports the events of
// the records from that position to the stream's end that the record does
// not name as accounted: those removed while no runtime knew of them, or
// before the one that knew reported them. Count, position and names are
// saved together, so that a crash anywhere counts each event once. A
// start that takes a hand-over skips the records before it: the clean
// stop accounted for those events, or handed them over. A record whose
// event no runtime accounts for within removalsStale (its sequence never
// seen: the record came after the start's count) is passed over with a
// warning.
//
// What is left: the records are not complete. nats-server 2.15.2 sends a
// record only for an event still in the consumer's pending set when the
// stream removes it (decStreamPending); its checkPending, which runs 10 ms
// after every NakWithDelay, drops a pending entry below the stream's new
// first sequence without a record, and it can run between the store's
// removal and decStreamPending. So an event handed back for a backoff may
// be removed with no record: a running runtime still counts what it holds
// itself, and such a removal while no runtime runs (after a crash) is not
// reported. The notifier's crash test names those events and allows them
// alone. An event whose effect a runtime performed and
// did not acknowledge before it died, removed before another runtime got
// it again, is reported missed though delivered: an over-report, never a
// silent loss.

// limitsReasons are the reasons of the advisories of removals by a
// stream's limits (the server's ackTermUnackedLimitsReason and
// ackTermLimitsReason); a consumer's own termination has another.
var limitsReasons = map[string]bool{
	"Unacknowledged message was deleted": true,
	"Message deleted by stream limits":   true,
}

// removalAdvisory is what the runtime reads of a removal record (the
// server's JSConsumerDeliveryTerminatedAdvisory).
type removalAdvisory struct {
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	StreamSeq uint64 `json:"stream_seq"`
	Reason    string `json:"reason"`
}

// resolvedMax bounds GapRecord.Resolved.
const resolvedMax = 1024

// removalsReadEvery is how often, at most, a running runtime reads the
// removals' stream; removalsStale is how long a record may wait for its
// event to be accounted for.
var (
	// limitsReadEvery is how often, at most, it reads how near the
	// stream is to its limits.
	limitsReadEvery   = 100 * time.Millisecond
	removalsReadEvery = 250 * time.Millisecond
	removalsStale     = 10 * time.Minute
)

// removals is the runtime's reader of the removals' stream.
type removals struct {
	mu     sync.Mutex
	stream jetstream.Stream // nil: no removals' stream
	// read is the last record read; queue the records read whose events
	// are not accounted for yet, in order.
	read     uint64
	queue    []removalRecord
	lastRead time.Time
	// created is when the stream read was made: another time is another
	// stream of the same name, whose sequences start again.
	created time.Time
	// near: the stream was within half of a limit when read at
	// limitsRead (see nearLimits).
	near       bool
	limitsRead time.Time
	// resolved are the events accounted for (reported or finished) by
	// this runtime, or named so in the gap record it started from.
	resolved recentSeqs
}

// removalRecord is a record of the removals' stream (rec) of the event of
// stream sequence seq, read at since.
type removalRecord struct {
	rec, seq uint64
	since    time.Time
}

// openRemovals looks up the removals' stream at a consumer's start, where
// the runtime has one (Config.Removals); false: none.
func (r *Runtime) openRemovals(ctx context.Context) bool {
	if r.cfg.Removals == "" || !r.cfg.EveryEvent {
		return false
	}
	rm := &r.removals
	rm.mu.Lock()
	defer rm.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := r.js.Stream(cctx, r.cfg.Removals)
	if err != nil {
		rm.stream = nil
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			r.log.Warn("no removals' stream: an event the stream's limits remove while this consumer holds it unacknowledged is reported only while a runtime knows of it (not across a crash); the relay creates the stream with the effects' stream",
				"stream", r.cfg.Removals)
		} else {
			r.log.Warn("the removals' stream could not be read: an event removed while no runtime held it is not reported", "stream", r.cfg.Removals, "err", err)
		}
		return false
	}
	rm.stream = s
	rm.created = s.CachedInfo().Created
	rm.queue = nil
	for _, seq := range r.LastGap().Resolved {
		rm.resolved.add(seq)
	}
	return true
}

// startRemovals returns, at a consumer's start with a removals' stream,
// what the runtime before left unaccounted for, unless it handed it over
// (handedOver): the events the records from the saved position show
// removed that the gap record does not name as accounted for. And it
// suspects again what that runtime had stepped over and not reported, and
// every sequence delivered after the last it had seen up to delivered
// (the consumer's last delivery now): none of those was acknowledged, and
// one neither delivered again nor shown removed by a record was stepped
// over. The position goes to the stream's end; the caller reports the
// spans and saves the record.
func (r *Runtime) startRemovals(ctx context.Context, handedOver bool, delivered uint64) []gapSpan {
	rm := &r.removals
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if rm.stream == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rm.stream.Info(cctx)
	if err != nil {
		r.log.Warn("the removals' stream could not be read: an event removed while no runtime held it may not be reported", "stream", r.cfg.Removals, "err", err)
		return nil
	}
	last := info.State.LastSeq
	rec := r.LastGap()
	var spans []gapSpan
	if !handedOver {
		if next := rec.RemovalsNext; next > 0 && next <= last {
			spans = r.unaccounted(cctx, info, next, last)
		}
		due := time.Now().Add(2 * r.cfg.AckWait)
		g := &r.gaps
		g.mu.Lock()
		region := rec.Seen > 0 && delivered > rec.Seen
		for _, sp := range rec.Suspects {
			if region {
				sp[1] = min(sp[1], rec.Seen) // the rest is in the region
			}
			if sp[0] <= sp[1] {
				g.suspects = append(g.suspects, gapSpan{from: sp[0], to: sp[1], due: due, handed: true})
			}
		}
		if region {
			g.suspects = append(g.suspects, gapSpan{from: rec.Seen + 1, to: delivered, due: due, handed: true})
		}
		g.changed = true
		g.mu.Unlock()
	}
	rm.read = last
	r.gaps.mu.Lock()
	r.gaps.startDelivered = 0
	if !handedOver {
		// After a hand-over, what the runtime before held is owed by
		// the hand-over, and a record of it is not this start's.
		r.gaps.startDelivered = delivered
	}
	r.gaps.mu.Unlock()
	r.gapMu.Lock()
	r.gapRecord.RemovalsNext = last + 1
	if r.gapRecord.Seen > 0 {
		r.gapRecord.Seen = max(r.gapRecord.Seen, delivered)
	}
	r.gapMu.Unlock()
	return spans
}

// unaccounted reads the records next..last and returns a span for each
// event of this consumer they show removed and the gap record does not
// name as accounted for. Records the stream's own limits removed unread
// are counted too, each as one event (they cannot be told apart).
func (r *Runtime) unaccounted(ctx context.Context, info *jetstream.StreamInfo, next, last uint64) []gapSpan {
	rm := &r.removals
	var spans []gapSpan
	if first := info.State.FirstSeq; first > next {
		r.log.Error(fmt.Sprintf("%d records of the removals' stream were removed by its own limits before this consumer read them: each is counted as an event missed", first-next),
			"stream", r.cfg.Removals, "from", next, "to", first-1)
		spans = append(spans, gapSpan{from: next, to: first - 1, unacked: true, count: first - next, lostRecords: true})
		next = first
	}
	for seq := next; seq <= last; seq++ {
		a, ok, err := r.removalRecord(ctx, seq)
		if err != nil {
			r.log.Error("a record of the removals' stream could not be read: an event it shows removed may not be reported", "stream", r.cfg.Removals, "seq", seq, "err", err)
			continue
		}
		if !ok || rm.resolved.has(a.StreamSeq) {
			continue
		}
		rm.resolved.add(a.StreamSeq) // the server may record a removal twice
		spans = append(spans, gapSpan{from: a.StreamSeq, to: a.StreamSeq, unacked: true, count: 1, removed: true})
	}
	return spans
}

// removalRecord reads record seq: its advisory, and whether it is a
// removal by the limits of one of this consumer's events.
func (r *Runtime) removalRecord(ctx context.Context, seq uint64) (removalAdvisory, bool, error) {
	var a removalAdvisory
	m, err := r.removals.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return a, false, nil
	}
	if err != nil {
		return a, false, err
	}
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return a, false, nil
	}
	return a, a.Stream == r.cfg.Stream && a.Consumer == r.cfg.Name && limitsReasons[a.Reason], nil
}

// followRemovals reads the records that came since the last read (unless
// that was less than removalsReadEvery ago; force: now), and moves the
// position past those whose events are accounted for, reporting those of
// events delivered before this runtime started that it never saw. It
// reports whether the record changed: it is then to be saved.
func (r *Runtime) followRemovals(ctx context.Context, force bool) bool {
	rm := &r.removals
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if rm.stream == nil || (!force && time.Since(rm.lastRead) < removalsReadEvery) {
		return false
	}
	rm.lastRead = time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rm.stream.Info(cctx)
	if err != nil {
		r.log.Warn("reading the removals' stream failed; reading it again later", "stream", r.cfg.Removals, "err", err)
		return false
	}
	last := info.State.LastSeq
	if !info.Created.Equal(rm.created) || last < rm.read {
		// The stream was deleted and made again (or restored from an
		// older backup): its sequences start again, and a position in
		// the one before would pass over its records until they caught
		// up. Read it from its start; the events still owed keep their
		// place in the queue, at the new stream's start.
		r.log.Warn("the removals' stream was made again since this runtime read it: reading the new one from its start; a removal recorded only in the old one, of an event no runtime held, is not reported",
			"stream", r.cfg.Removals, "read", rm.read, "last", last)
		rm.created, rm.read = info.Created, 0
		for i := range rm.queue {
			rm.queue[i].rec = 1
		}
	}
	for seq := max(rm.read+1, info.State.FirstSeq); seq <= last; seq++ {
		a, ok, err := r.removalRecord(cctx, seq)
		if err != nil {
			r.log.Warn("reading a record of the removals' stream failed; reading it again later", "stream", r.cfg.Removals, "seq", seq, "err", err)
			break
		}
		rm.read = seq
		if ok {
			rm.queue = append(rm.queue, removalRecord{rec: seq, seq: a.StreamSeq, since: time.Now()})
		}
	}
	// A record of an event delivered before this runtime started, which
	// it never saw again: the runtime before held it, and nothing else
	// accounts for it.
	var spans []gapSpan
	r.gaps.mu.Lock()
	for _, q := range rm.queue {
		g := &r.gaps
		if q.seq <= g.startDelivered && !g.observed.has(q.seq) && !g.settled.has(q.seq) && !rm.resolved.has(q.seq) {
			rm.resolved.add(q.seq)
			spans = append(spans, gapSpan{from: q.seq, to: q.seq, unacked: true, count: 1, removed: true})
		}
	}
	r.gaps.mu.Unlock()
	if len(spans) > 0 {
		rm.mu.Unlock()
		r.report(spans)
		rm.mu.Lock()
	}
	// An event acknowledged whose record came (removed while in hand, its
	// acknowledgement too late) is named accounted for in the gap record:
	// the position may stay behind it, at an event still owed.
	var acked []uint64
	r.gaps.mu.Lock()
	for _, q := range rm.queue {
		if r.gaps.settled.has(q.seq) && !rm.resolved.has(q.seq) {
			rm.resolved.add(q.seq)
			acked = append(acked, q.seq)
		}
	}
	r.gaps.mu.Unlock()
	if len(acked) > 0 {
		r.gapMu.Lock()
		r.gapRecord.Resolved = append(r.gapRecord.Resolved, acked...)
		if n := len(r.gapRecord.Resolved); n > resolvedMax {
			r.gapRecord.Resolved = slices.Clone(r.gapRecord.Resolved[n-resolvedMax:])
		}
		r.gapMu.Unlock()
	}
	// The position: past every record read whose event is accounted for,
	// up to the first that is not.
	next := rm.read + 1
	r.gaps.mu.Lock()
	for len(rm.queue) > 0 {
		q := rm.queue[0]
		if !r.gaps.settled.has(q.seq) && !rm.resolved.has(q.seq) {
			if time.Since(q.since) < removalsStale {
				next = q.rec
				break
			}
			r.log.Warn("a record of the removals' stream names an event this runtime never accounted for; passed over", "stream", r.cfg.Removals, "record", q.rec, "seq", q.seq)
		}
		rm.queue = rm.queue[1:]
	}
	r.gaps.mu.Unlock()
	r.gapMu.Lock()
	defer r.gapMu.Unlock()
	if next == r.gapRecord.RemovalsNext && len(acked) == 0 && len(spans) == 0 {
		return false
	}
	r.gapRecord.RemovalsNext = next
	return true
}

// open reports whether the runtime reads a removals' stream.
func (rm *removals) open() bool {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.stream != nil
}

// resolve records seqs as accounted for (reported missed, or finished by
// the store): a removal record of one is passed over, also by a start
// after a crash (GapRecord.Resolved, saved with the count).
func (r *Runtime) resolve(seqs ...uint64) {
	if r.cfg.Removals == "" || len(seqs) == 0 {
		return
	}
	r.removals.mu.Lock()
	for _, seq := range seqs {
		r.removals.resolved.add(seq)
	}
	r.removals.mu.Unlock()
	r.gapMu.Lock()
	r.gapRecord.Resolved = append(r.gapRecord.Resolved, seqs...)
	if n := len(r.gapRecord.Resolved); n > resolvedMax {
		r.gapRecord.Resolved = slices.Clone(r.gapRecord.Resolved[n-resolvedMax:])
	}
	r.gapMu.Unlock()
}

// saveSeen saves, before a batch is acknowledged, the highest sequence
// seen when it raised it (GapRecord.Seen), with the suspects: a start after
// a crash suspects only what was delivered after it. It does so while the
// stream is near its limits (half its size or message bound, or a first
// message half its age limit old): only then
// can an event delivered to the client and not yet seen have had a
// predecessor removed before its delivery, and a consumer update per
// batch slows the notifier. Far from them it saves Seen 0 once, and a
// start after a crash suspects nothing. Without a removals' stream it
// does nothing.
func (r *Runtime) saveSeen(ctx context.Context) {
	if !r.cfg.EveryEvent || !r.removals.open() {
		return
	}
	near := r.nearLimits(ctx)
	r.gaps.mu.Lock()
	highest := r.gaps.highest
	r.gaps.mu.Unlock()
	r.gapMu.Lock()
	was := r.gapRecord.Seen
	switch {
	case near && highest > was:
		r.gapRecord.Seen = highest
	case !near && was > 0:
		r.gapRecord.Seen = 0
	}
	changed := r.gapRecord.Seen != was
	r.gapMu.Unlock()
	if !changed {
		return
	}
	if err := r.saveGapRecord(ctx, nil); err != nil {
		r.log.Warn("the highest sequence seen could not be saved before the batch's acknowledgements: a crash before the next save may report some of its events missed", "seen", highest, "err", err)
	}
}

// nearLimits reports whether the stream is within half of one of its
// limits, from its state read at most every limitsReadEvery (an unread
// state counts as near).
func (r *Runtime) nearLimits(ctx context.Context) bool {
	rm := &r.removals
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if time.Since(rm.limitsRead) < limitsReadEvery {
		return rm.near
	}
	rm.limitsRead = time.Now()
	r.gaps.mu.Lock()
	read := r.gaps.stream
	r.gaps.mu.Unlock()
	rm.near = true
	if read == nil {
		return true
	}
	info, err := read(ctx)
	if err != nil {
		return true
	}
	c, st := info.Config, info.State
	rm.near = (c.MaxBytes > 0 && 2*st.Bytes >= uint64(c.MaxBytes)) ||
		(c.MaxMsgs > 0 && 2*st.Msgs >= uint64(c.MaxMsgs)) ||
		(c.MaxAge > 0 && st.Msgs > 0 && 2*time.Since(st.FirstTime) >= c.MaxAge)
	return rm.near
}

// withoutResolved drops from spans of sequences stepped over those a
// removal record accounted for (or that were acknowledged since).
func (r *Runtime) withoutResolved(spans []gapSpan) []gapSpan {
	if !r.removals.open() {
		return spans
	}
	rm := &r.removals
	rm.mu.Lock()
	defer rm.mu.Unlock()
	r.gaps.mu.Lock()
	defer r.gaps.mu.Unlock()
	done := func(seq uint64) bool { return rm.resolved.has(seq) || r.gaps.settled.has(seq) }
	var out []gapSpan
	for _, s := range spans {
		if s.unacked || s.window || s.to-s.from >= uint64(resolvedMax)*16 {
			out = append(out, s)
			continue
		}
		part, open := s, false
		for seq := s.from; seq <= s.to; seq++ {
			switch {
			case done(seq) && open:
				part.to = seq - 1
				out = append(out, part)
				open = false
			case !done(seq) && !open:
				part.from, part.to = seq, s.to
				open = true
			}
		}
		if open {
			out = append(out, part)
		}
	}
	return out
}
