package rebuild

import (
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/projector"
)

// A failed step is tried again after 1s, doubled per attempt, capped at
// RetryMax (30s by default; below 1s, every delay), without jitter.
func TestManagerBackoff(t *testing.T) {
	stores := &inPlaceStores{store: &recStore{versions: map[string]int64{}}}
	g, _ := stores.Open(t.Context(), "db")
	for _, tc := range []struct {
		retryMax time.Duration
		want     []time.Duration // attempts 1, 2, ...
	}{
		{0, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}},
		{5 * time.Second, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{500 * time.Millisecond, []time.Duration{500 * time.Millisecond, 500 * time.Millisecond}},
	} {
		m, err := NewManager(Config{Runtime: projector.Config{Name: "graph"}, RetryMax: tc.retryMax}, stores, NewSwitch(g), nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range tc.want {
			if got := m.backoff.Delay(i + 1); got != want {
				t.Errorf("RetryMax %v, attempt %d: delay %v; want %v", tc.retryMax, i+1, got, want)
			}
		}
		if got := m.backoff.Delay(100); got != tc.want[len(tc.want)-1] {
			t.Errorf("RetryMax %v, attempt 100: delay %v; want %v", tc.retryMax, got, tc.want[len(tc.want)-1])
		}
	}
}
