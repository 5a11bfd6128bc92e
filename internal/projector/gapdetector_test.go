package projector

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A sequence stepped over is a suspect until twice the acknowledgement
// wait has passed: the server delivers again, after the wait, a message it
// gave to a pull request the runtime never read (a consumer leader's loss,
// a slow-consumer drop), and that is no gap. What is still owed at the
// deadline, or when the runtime stops, is.
func TestGapDetectorWaitsForRedeliveries(t *testing.T) {
	var g gapDetector
	g.restart(0, 1, 0, 2*time.Minute, time.Now())
	t0 := time.Now()
	g.observe(6, t0) // 2..5 stepped over
	g.observe(7, t0)
	if due := g.due(t0.Add(time.Minute), false); len(due) != 0 {
		t.Fatalf("reported %v before the grace ended", due)
	}
	// 3 and 4 are delivered again: 2 and 5 are still owed.
	g.observe(3, t0.Add(time.Minute))
	g.observe(4, t0.Add(time.Minute))
	g.observe(9, t0.Add(time.Minute)) // 8 stepped over, later
	due := g.due(t0.Add(2*time.Minute), false)
	if len(due) != 2 || due[0].from != 2 || due[0].to != 2 || due[1].from != 5 || due[1].to != 5 {
		t.Fatalf("due at the grace's end: %+v; want 2..2 and 5..5", due)
	}
	if again := g.due(t0.Add(2*time.Minute), false); len(again) != 0 {
		t.Fatalf("reported twice: %+v", again)
	}
	// 8, delivered again in time, is no gap; a later jump is, at stop.
	g.observe(8, t0.Add(90*time.Second))
	g.observe(12, t0.Add(2*time.Minute))
	if due := g.due(t0.Add(3*time.Minute), false); len(due) != 0 {
		t.Fatalf("8 and 10..11 not yet due, got %+v", due)
	}
	if due := g.due(t0.Add(3*time.Minute), true); len(due) != 1 || due[0].from != 10 || due[0].to != 11 {
		t.Fatalf("at stop: %+v; want 10..11", due)
	}

	// A split keeps both sides; a restart keeps what is owed, a replay
	// (the consumer went back) drops it.
	g.observe(20, t0)
	g.observe(15, t0)
	if len(g.suspects) != 2 || g.suspects[0].to != 14 || g.suspects[1].from != 16 {
		t.Fatalf("after the split: %+v; want 13..14 and 16..19", g.suspects)
	}
	g.restart(0, 20, 0, 2*time.Minute, time.Now())
	if len(g.suspects) != 2 {
		t.Fatalf("a restart dropped what is owed: %+v", g.suspects)
	}
	g.restart(0, 5, 0, 2*time.Minute, time.Now())
	if len(g.suspects) != 0 {
		t.Fatalf("a replay kept %+v", g.suspects)
	}
}

// A sequence this runtime handed back in an earlier term, acknowledged
// since by the writer of another term (below the consumer's floor at the
// restart), is owed no longer: no false report.
func TestOwedSequenceAcknowledgedSinceIsNoGap(t *testing.T) {
	var g gapDetector
	t0 := time.Now()
	g.restart(0, 4, 0, time.Second, t0)
	g.markOwed(3, nil, t0) // handed back, due again within the grace
	g.restart(6, 8, 1, time.Second, t0.Add(time.Second))
	if due := g.due(t0.Add(time.Hour), false); len(due) != 1 || due[0].from != 7 || due[0].count != 1 {
		t.Fatalf("due: %+v; want only the 1 pending event of 7..8, not 3", due)
	}
}

// On a work queue a due span is reported only once the stream shows it
// gone (below the stream's first sequence); one still in the stream is a
// late redelivery (a leader change) and is owed for another grace. On
// other streams the grace alone decides.
func TestDueSpansAreProvenOnAWorkQueue(t *testing.T) {
	for _, retention := range []jetstream.RetentionPolicy{jetstream.WorkQueuePolicy, jetstream.LimitsPolicy} {
		g := gapDetector{stream: func(context.Context) (*jetstream.StreamInfo, error) {
			return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Retention: retention}, State: jetstream.StreamState{FirstSeq: 5}}, nil
		}}
		t0 := time.Now()
		g.restart(0, 1, 0, time.Second, t0)
		g.observe(4, t0) // 2..3 stepped over: gone
		g.observe(8, t0) // 5..7 stepped over: still in the stream
		g.markOwed(8, nil, t0)
		got := g.proven(context.Background(), g.due(t0.Add(time.Hour), false), false)
		if retention == jetstream.LimitsPolicy {
			if len(got) != 3 {
				t.Fatalf("limits stream: %+v, want all three spans", got)
			}
			continue
		}
		if len(got) != 1 || got[0].from != 2 || got[0].to != 3 {
			t.Fatalf("work queue: reported %+v, want only 2..3", got)
		}
		if len(g.suspects) != 1 || g.suspects[0].from != 5 || len(g.owed) != 1 {
			t.Fatalf("work queue: put back suspects %+v and owed %v, want 5..7 and 8", g.suspects, g.owed)
		}
	}
}

// A runtime that stops on a work queue reports what the stream shows gone
// and hands the rest over: its owed sequences, its suspects, and what the
// consumer delivered to pull requests it never read. The next start owes
// itself exactly those, and what was delivered after the stop, and counts
// no window; a replay owes nothing.
func TestHandOverToTheNextStart(t *testing.T) {
	var g gapDetector
	t0 := time.Now()
	g.restart(0, 0, 0, time.Second, t0)
	for _, seq := range []uint64{1, 2, 3, 4, 7, 8, 9, 10} { // 5..6 stepped over
		g.observe(seq, t0)
	}
	g.markOwed(3, nil, t0)
	g.markOwed(8, nil, t0)
	// The stream begins at 6 now; the consumer delivered up to 12.
	gone, held, _ := g.handOver(6, 12)
	if len(gone) != 2 || gone[0].from != 3 || gone[0].to != 3 || gone[1].from != 5 || gone[1].to != 5 {
		t.Fatalf("gone: %+v; want 3 and 5", gone)
	}
	h := newGapHandover(12, held, pendingWindow{})
	if want := [][2]uint64{{6, 6}, {8, 8}, {11, 12}}; !slices.Equal(h.Owed, want) {
		t.Fatalf("handed over %v, want %v", h.Owed, want)
	}
	if len(g.suspects) != 0 || len(g.owed) != 0 {
		t.Fatalf("the stopped detector kept %+v and %v", g.suspects, g.owed)
	}

	// The next start: 13..14 were delivered meanwhile, to nobody.
	var next gapDetector
	spans, w := h.held()
	t1 := t0.Add(time.Minute)
	next.resume(spans, w, h.Delivered, 14, time.Second, t1)
	next.observe(8, t1)
	next.observe(13, t1)
	if next.pending.expected != 0 {
		t.Fatalf("a window of %d was opened", next.pending.expected)
	}
	var got [][2]uint64
	for _, s := range next.due(t1.Add(time.Second), false) {
		got = append(got, [2]uint64{s.from, s.to})
		if !s.handed {
			t.Errorf("span %d..%d not marked as owed across the restart", s.from, s.to)
		}
	}
	if want := [][2]uint64{{6, 6}, {11, 12}, {14, 14}}; !slices.Equal(got, want) {
		t.Fatalf("due after the grace: %v, want %v", got, want)
	}

	var replayed gapDetector
	replayed.resume(spans, w, h.Delivered, 4, time.Second, t1)
	if len(replayed.suspects) != 0 || replayed.highest != 4 {
		t.Fatalf("after a replay: %+v, highest %d", replayed.suspects, replayed.highest)
	}
}

// A stale copy of a message (delivered again after its acknowledgement
// wait while the first copy was in hand), handed back after its sequence
// was acknowledged or reported, is not owed: the stream no longer holds
// it, and it is no loss, or one already counted.
func TestStaleCopyIsNotOwed(t *testing.T) {
	var g gapDetector
	t0 := time.Now()
	g.restart(0, 0, 0, time.Second, t0)
	g.observe(1, t0)
	g.observe(2, t0)
	g.markOwed(1, nil, t0) // the fresh copy handed back...
	g.settle(1)            // ...and the stale one acknowledged
	g.markOwed(2, nil, t0)
	g.reported(g.due(t0.Add(time.Hour), false))
	g.markOwed(2, nil, t0.Add(time.Hour)) // a stale copy of what was reported
	g.settle(3)
	g.markOwed(3, nil, t0)
	if len(g.owed) != 0 {
		t.Fatalf("owed %v, want nothing", g.owed)
	}
	var small recentSeqs
	small.size = 2
	for seq := uint64(1); seq <= 3; seq++ {
		small.add(seq)
	}
	if small.has(1) || !small.has(2) || !small.has(3) {
		t.Fatalf("the last two of 1..3: %v", small.set)
	}
}

// An owed event gone from a work queue is reported only once every
// message the consumer had delivered by then has been seen: a copy
// delivered before the event went may still be in hand (buffered, or in
// the batch fetched ahead), and is handled, not missed.
func TestGoneEventWaitsForTheCopiesInHand(t *testing.T) {
	g := gapDetector{
		stream: func(context.Context) (*jetstream.StreamInfo, error) {
			return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Retention: jetstream.WorkQueuePolicy}, State: jetstream.StreamState{FirstSeq: 10}}, nil
		},
		consumer: func(context.Context) (*jetstream.ConsumerInfo, error) {
			return &jetstream.ConsumerInfo{Delivered: jetstream.SequenceInfo{Consumer: 50}}, nil
		},
	}
	t0 := time.Now()
	g.restart(0, 0, 0, time.Second, t0)
	for seq := uint64(1); seq <= 8; seq++ {
		g.observe(seq, t0)
	}
	g.sawDelivery(40)
	g.markOwed(5, nil, t0)
	g.markOwed(6, nil, t0)
	if got := g.proven(context.Background(), g.due(t0.Add(2*time.Second), false), false); len(got) != 0 {
		t.Fatalf("reported %+v while deliveries 41..50 are unseen", got)
	}
	g.observe(5, t0.Add(2*time.Second)) // a copy of 5 was in hand
	g.sawDelivery(50)
	got := g.proven(context.Background(), g.due(t0.Add(2*time.Second), false), false)
	if len(got) != 1 || got[0].from != 6 {
		t.Fatalf("reported %+v, want 6 alone", got)
	}
}
