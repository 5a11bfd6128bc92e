package console

import (
	"testing"
	"time"
)

// A rate is measured over the last two seconds at least, so that a
// counter moving in bursts is not shown as zeros between them, and starts
// again after the counter went back.
func TestRateIsMeasuredOverItsWindow(t *testing.T) {
	r := rates{}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, step := range []struct {
		ms   int
		v    float64
		want float64 // -1: none
	}{
		{0, 0, -1},
		{100, 100, 1000}, // 100 in 0.1 s
		{200, 100, 500},  // still over the whole 0.2 s: a burst then nothing
		{1000, 100, 100}, // 100 in 1 s
		{2200, 300, 100}, // over the 2 s from 200 ms, the last sample at the window's edge
		{2300, 300, 200.0 / 2.1},
		{2400, 10, -1}, // went back: a restart
		{3400, 110, 100},
	} {
		got := r.rate("k", step.v, at(step.ms))
		switch {
		case step.want < 0 && got != nil:
			t.Errorf("at %dms: rate %v, want none", step.ms, *got)
		case step.want >= 0 && (got == nil || *got < step.want-1e-9 || *got > step.want+1e-9):
			t.Errorf("at %dms: rate %v, want %v", step.ms, got, step.want)
		}
	}
}
