package notifier

import (
	"testing"
	"time"
)

func TestSightings(t *testing.T) {
	s := newSightings(time.Hour)
	t0 := time.Now()
	for _, step := range []struct {
		name string
		key  string
		rev  uint64
		at   time.Duration // after t0
		want time.Duration
	}{
		{"first sight", "a", 1, 0, 0},
		{"unchanged", "a", 1, 10 * time.Second, 10 * time.Second},
		{"a new revision starts again", "a", 2, 20 * time.Second, 0},
		{"the old revision again", "a", 1, 30 * time.Second, 0},
		{"another key", "b", 1, 30 * time.Second, 0},
		{"each its own", "a", 1, 40 * time.Second, 10 * time.Second},
	} {
		if got := s.since(step.key, step.rev, t0.Add(step.at)); got != step.want {
			t.Fatalf("%s: since = %v, want %v", step.name, got, step.want)
		}
	}
	// A revision this process wrote counts from the write.
	s.wrote("c", 7, t0)
	if got := s.since("c", 7, t0.Add(time.Minute)); got != time.Minute {
		t.Fatalf("written revision: since = %v, want 1m", got)
	}
	s.forget("c")
	if got := s.since("c", 7, t0.Add(2*time.Minute)); got != 0 {
		t.Fatalf("forgotten: since = %v, want 0", got)
	}
	// Sightings older than forgetAfter go at the next sweep.
	s.since("d", 1, t0.Add(2*time.Hour))
	if n := s.len(); n != 1 {
		t.Fatalf("%d sightings after the sweep, want 1", n)
	}
}
