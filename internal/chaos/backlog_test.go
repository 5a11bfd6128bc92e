//go:build linux

package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// backlogs samples, every interval, each service consumer's backlog (its
// pending and unacknowledged events): the largest over the run and the
// last one read, so that the summary says whether each consumer kept up
// while the faults went on, and how far behind the load's end found it.
type backlogs struct {
	mu   sync.Mutex
	max  map[string]uint64
	last map[string]uint64
	at   map[string]time.Time // when the largest was read
}

func (p *pipeline) sampleBacklogs(ctx context.Context, every time.Duration) (*backlogs, func()) {
	b := &backlogs{max: map[string]uint64{}, last: map[string]uint64{}, at: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			b.sample(ctx, p)
		}
	}()
	return b, func() { cancel(); <-done }
}

func (b *backlogs) sample(ctx context.Context, p *pipeline) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, stream := range []string{"CONVERGE_DOCS", "CONVERGE_EVENTS"} {
		s, err := p.js.Stream(ctx, stream)
		if err != nil {
			continue // NATS down: the next sample
		}
		cs := s.ListConsumers(ctx)
		for c := range cs.Info() {
			if c.Config.Durable == "" {
				continue
			}
			n := c.NumPending + uint64(c.NumAckPending)
			b.mu.Lock()
			b.last[c.Name] = n
			if n >= b.max[c.Name] {
				b.max[c.Name], b.at[c.Name] = n, time.Now()
			}
			b.mu.Unlock()
		}
	}
}

// String is "consumer: largest (at hh:mm:ss), last read" for each.
func (b *backlogs) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var parts []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range b.max {
			if !yield(n) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s: largest %d (at %s), at the load's end %d", name, b.max[name], b.at[name].Format("15:04:05"), b.last[name]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}
