package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
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
// whose sequence is more than one past the highest seen is a gap; a
// redelivery (a sequence at or below it) is not. The messages the runtime
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

// gapDetector follows the stream sequences delivered, in fetch order.
type gapDetector struct {
	highest uint64 // the highest stream sequence seen
}

// observe takes the next delivered sequence and returns the gap before
// it, if any: the sequences from..to never delivered.
func (g *gapDetector) observe(seq uint64) (from, to uint64, gap bool) {
	if seq <= g.highest {
		return 0, 0, false // a redelivery
	}
	from, to, gap = g.highest+1, seq-1, seq > g.highest+1
	g.highest = seq
	return from, to, gap
}

// checkGaps runs the gap detector over msgs (in fetch order, that is
// stream order), counts and logs each gap, and saves the record once if
// there was one. Without Config.EveryEvent it does nothing.
func (r *Runtime) checkGaps(ctx context.Context, msgs []jetstream.Msg) {
	if !r.cfg.EveryEvent {
		return
	}
	found := false
	for _, m := range msgs {
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		from, to, gap := r.gaps.observe(meta.Sequence.Stream)
		if !gap {
			continue
		}
		found = true
		n := to - from + 1
		r.metrics.Missed.Add(float64(n))
		r.log.Error(fmt.Sprintf("events with stream sequences %d..%d were never delivered: the stream's limits (its per-subject history, age or size) removed them before this consumer read them", from, to),
			"missed", n, "from", from, "to", to, "stream", r.cfg.Stream)
		r.gapMu.Lock()
		r.gapRecord.Missed += n
		r.gapRecord.LastFrom, r.gapRecord.LastTo, r.gapRecord.At = from, to, time.Now().UTC()
		r.gapMu.Unlock()
	}
	if found {
		r.saveGapRecord(ctx)
	}
}

// startGaps sets the detector at the start of a consumer (see the rule
// above) and takes up the record its metadata holds.
func (r *Runtime) startGaps(info *jetstream.ConsumerInfo) {
	if !r.cfg.EveryEvent || info == nil {
		return
	}
	r.gaps = gapDetector{highest: info.Delivered.Stream}
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
