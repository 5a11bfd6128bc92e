package projector

import (
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/retry"
)

// The runtime's backoff is the shared one over RetryMin and RetryMax:
// exact with retry.NoJitter, and by default jittered within [d/2, d].
func TestBackoffIsTheSharedOne(t *testing.T) {
	cfg := Config{Name: "idx", RetryMin: 100 * time.Millisecond, RetryMax: time.Second}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	full := map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 80: time.Second}

	exact := cfg
	exact.RetryJitter = retry.NoJitter
	r := &Runtime{cfg: exact}
	for attempt, want := range full {
		if d := r.backoff(attempt); d != want {
			t.Errorf("no jitter, attempt %d: %v, want %v", attempt, d, want)
		}
	}

	r = &Runtime{cfg: cfg}
	for attempt, want := range full {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := r.backoff(attempt)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, want/2, want)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("attempt %d: only %d distinct delays: no jitter", attempt, len(seen))
		}
	}
}

// The defaults are the shared backoff's: 100ms, doubled up to 30s.
func TestBackoffDefaults(t *testing.T) {
	cfg := Config{Name: "idx", RetryJitter: retry.NoJitter}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: cfg}
	if d := r.backoff(1); d != 100*time.Millisecond {
		t.Errorf("first backoff %v, want 100ms", d)
	}
	if d := r.backoff(100); d != 30*time.Second {
		t.Errorf("longest backoff %v, want 30s", d)
	}
}
