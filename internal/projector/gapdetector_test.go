package projector

import (
	"context"
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
	g.markOwed(3, t0) // handed back, due again within the grace
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
		g.markOwed(8, t0)
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
