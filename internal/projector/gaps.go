package projector

import (
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
}

// gapSpan is the stream sequences from..to, stepped over, due to be
// reported at due unless delivered before.
type gapSpan struct {
	from, to uint64
	due      time.Time
}

// observe takes the next delivered sequence: a redelivery clears its
// suspicion, a sequence more than one past the highest makes suspects of
// those between.
func (g *gapDetector) observe(seq uint64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
// one with all.
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
	return out
}

// restart sets the detector at a consumer's (re)start: highest is what the
// consumer has delivered. Suspects stay, since the server still owes them,
// unless the consumer went back (a replay), which delivers them again.
func (g *gapDetector) restart(delivered uint64, grace time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if delivered < g.highest {
		g.suspects = nil
	}
	g.highest, g.grace = delivered, grace
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
	spans := r.gaps.due(time.Now(), all)
	for _, g := range spans {
		from, to := g.from, g.to
		n := to - from + 1
		r.metrics.Missed.Add(float64(n))
		r.log.Error(fmt.Sprintf("events with stream sequences %d..%d were never delivered: the stream's limits (its per-subject history, age or size) removed them before this consumer read them", from, to),
			"missed", n, "from", from, "to", to, "stream", r.cfg.Stream)
		r.gapMu.Lock()
		r.gapRecord.Missed += n
		r.gapRecord.LastFrom, r.gapRecord.LastTo, r.gapRecord.At = from, to, time.Now().UTC()
		r.gapMu.Unlock()
	}
	if len(spans) > 0 {
		r.saveGapRecord(ctx)
	}
}

// startGaps sets the detector at the start of a consumer (see the rule
// above) and takes up the record its metadata holds.
func (r *Runtime) startGaps(info *jetstream.ConsumerInfo) {
	if !r.cfg.EveryEvent || info == nil {
		return
	}
	r.gaps.restart(info.Delivered.Stream, 2*r.cfg.AckWait)
	if stored, ok := ReadGapRecord(info.Config.Metadata); ok {
		r.gapMu.Lock()
		if stored.Missed >= r.gapRecord.Missed {
			r.gapRecord = stored
		}
		r.gapMu.Unlock()
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
