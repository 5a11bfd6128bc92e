package indextest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Steps of an [index.Index]'s write, in its order, at which a paused
// writer stops: before the call named (Markers#2 is the marker read after
// the writes).
var staleSteps = []string{"Upsert", "DeleteStale", "Counts", "Markers#2", "SetMarkers"}

// testStaleWriter runs, for every step of a write, a writer that lost its
// lease: it applies version 1 of a document and is paused before that
// step while the current writer applies version 2 whole; then it resumes
// and finishes its call. Whatever the step, the store must end as version
// 2 left it (its points alone, its marker), and a redelivery of either
// version must change nothing. A delete of "every other version", or a
// late write of version 1's points that no one removes, fails it.
//
// Then the one window the index leaves open (see the package doc of
// index): the late writer stops for good right after its points are
// written, after the current writer's delete. Its points stay; the
// redelivery of its event to the current writer removes them.
func testStaleWriter(t *testing.T, b index.Backend) {
	versions := func(key string) (v1, v2 *contract.Event) {
		v1, v2 = event(key, 1, body(6, "alpha")), event(key, 2, body(3, "beta"))
		if len(v1.Chunks) <= len(v2.Chunks) {
			t.Fatalf("version 1 has %d chunks, version 2 %d: version 1 needs more", len(v1.Chunks), len(v2.Chunks))
		}
		return v1, v2
	}
	for i, step := range staleSteps {
		t.Run("PausedBefore"+step, func(t *testing.T) {
			v1, v2 := versions(fmt.Sprintf("doc-%d", i))
			late, done := startPaused(t, b, step, ctx(), nil, v1)
			current := newIndex(t, b)
			if got := apply(t, current, v2); got[0] != projector.Applied {
				t.Fatalf("the current writer's v2: %v, want applied", got)
			}
			close(late.resume)
			r := <-done
			if r.Err != nil {
				t.Fatalf("the late writer's v1, resumed before %s: %v", step, r.Err)
			}
			expect(t, b, v2)
			// Redeliveries, to either writer, change nothing.
			if got := apply(t, current, v1, v2); got[0] != projector.Skipped || got[1] != projector.Skipped {
				t.Fatalf("redelivering v1 and v2: %v, want both skipped", got)
			}
			expect(t, b, v2)
			t.Logf("late writer paused before %s: its v1 %v (0 applied, 1 skipped); the store holds v2's %d points and marker", step, r.Outcome, len(v2.Chunks))
		})
	}

	t.Run("PointsLandAfterTheCurrentWritersDelete", func(t *testing.T) {
		// The current writer pauses before its count fence; the late
		// writer's points land after the current one's delete. The late
		// one's fence counts only its version and older ones and passes;
		// the current one's fails on the late points; its retry and the
		// late event's redelivery leave version 2 alone.
		v1, v2 := versions("doc-cross")
		paused, done := startPaused(t, b, "Counts", ctx(), nil, v2)
		current, stale := newIndex(t, b), newIndex(t, b)
		r1 := stale.Apply(ctx(), []*contract.Event{v1})[0]
		close(paused.resume)
		r2 := <-done
		if r1.Err != nil || r2.Err == nil {
			t.Fatalf("the late v1 should pass its fence and the current v2 fail on the late points: late v1 %+v, current v2 %+v", r1, r2)
		}
		if got := apply(t, current, v2); got[0] != projector.Applied {
			t.Fatalf("the current writer's retry of v2: %v, want applied", got)
		}
		if got := apply(t, current, v1); got[0] != projector.Skipped {
			t.Fatalf("v1 redelivered to the current writer: %v, want skipped", got)
		}
		expect(t, b, v2)
	})

	t.Run("NewerPointsDoNotBlockAnOlderVersion", func(t *testing.T) {
		// A writer stopped after writing version 2's points and before
		// their marker; version 1, still due, comes first. It is applied
		// (the newer points are version 2's to settle), and version 2
		// after it leaves itself alone. Before, the fence counted every
		// point, failed, and version 1 was retried for ever.
		v1, v2 := versions("doc-newer")
		killed, kill := context.WithCancel(ctx())
		stopped, done := startPaused(t, b, "DeleteStale", killed, nil, v2)
		kill()
		close(stopped.resume)
		if r := <-done; r.Err == nil {
			t.Fatalf("the stopped writer's call returned %+v, want its context's error", r)
		}
		current := newIndex(t, b)
		if got := apply(t, current, v1); got[0] != projector.Applied {
			t.Fatalf("v1 with v2's points already written: %v, want applied", got)
		}
		if got := apply(t, current, v2); got[0] != projector.Applied {
			t.Fatalf("v2 after v1: %v, want applied", got)
		}
		expect(t, b, v2)
	})

	t.Run("LateWriterKilledAfterItsPoints", func(t *testing.T) {
		v1, v2 := versions("doc-killed")
		killed, kill := context.WithCancel(ctx())
		late, done := startPaused(t, b, "Upsert", killed, kill, v1) // the write lands, then the writer is gone
		current := newIndex(t, b)
		apply(t, current, v2)
		close(late.resume)
		if r := <-done; r.Err == nil {
			t.Fatalf("the killed writer's call returned %+v, want its context's error", r)
		}
		counts, err := b.Counts(ctx(), []string{v1.Key})
		must(t, err)
		if counts[v1.Key] != len(v1.Chunks)+len(v2.Chunks) {
			t.Fatalf("after the kill the store holds %d points; want v2's %d and the killed writer's %d", counts[v1.Key], len(v2.Chunks), len(v1.Chunks))
		}
		if got := apply(t, current, v1); got[0] != projector.Skipped {
			t.Fatalf("v1 redelivered to the current writer: %v, want skipped", got)
		}
		expect(t, b, v2)
	})
}

// startPaused starts applying ev in ctx through an index over b that
// stops before step, and returns once it has stopped: close the
// pausing's resume to go on; the call's result arrives on the channel.
// after, when set, runs once the paused call has returned.
func startPaused(t *testing.T, b index.Backend, step string, ctx context.Context, after func(), ev *contract.Event) (*pausing, <-chan projector.Result) {
	t.Helper()
	p := &pausing{Backend: b, at: step, paused: make(chan struct{}), resume: make(chan struct{}), after: after}
	x := newIndex(t, p)
	done := make(chan projector.Result, 1)
	go func() { done <- x.Apply(ctx, []*contract.Event{ev})[0] }()
	select {
	case <-p.paused:
	case r := <-done:
		t.Fatalf("the writer of %s v%d finished (%+v) without reaching %s", ev.Key, ev.Version, r, step)
	case <-time.After(time.Minute):
		t.Fatalf("the writer of %s v%d did not reach %s in a minute", ev.Key, ev.Version, step)
	}
	return p, done
}

// pausing is a backend whose first call of the step at stops until resume
// is closed (paused is closed when it stops); after, when set, runs once
// that call has returned.
type pausing struct {
	index.Backend
	at     string
	paused chan struct{}
	resume chan struct{}
	after  func()

	mu      sync.Mutex
	markers int
	stopped bool
}

func (p *pausing) step(ctx context.Context, name string) error {
	p.mu.Lock()
	if name == "Markers" {
		p.markers++
		if p.markers > 1 {
			name = fmt.Sprintf("Markers#%d", p.markers)
		}
	}
	stop := name == p.at && !p.stopped
	if stop {
		p.stopped = true
	}
	p.mu.Unlock()
	if !stop {
		return ctx.Err()
	}
	close(p.paused)
	<-p.resume
	return nil
}

func (p *pausing) done(err error) error {
	if p.after != nil && p.stopped {
		p.after()
		p.after = nil
	}
	return err
}

func (p *pausing) Markers(ctx context.Context, keys []string) (map[string]index.Marker, error) {
	if err := p.step(ctx, "Markers"); err != nil {
		return nil, err
	}
	return p.Backend.Markers(ctx, keys)
}

func (p *pausing) Upsert(ctx context.Context, points []index.Point) error {
	if err := p.step(ctx, "Upsert"); err != nil {
		return err
	}
	return p.done(p.Backend.Upsert(ctx, points))
}

func (p *pausing) DeleteStale(ctx context.Context, keep []index.Keep) error {
	if err := p.step(ctx, "DeleteStale"); err != nil {
		return err
	}
	return p.done(p.Backend.DeleteStale(ctx, keep))
}

func (p *pausing) Counts(ctx context.Context, keys []string) (map[string]int, error) {
	if err := p.step(ctx, "Counts"); err != nil {
		return nil, err
	}
	return p.Backend.Counts(ctx, keys)
}

func (p *pausing) SetMarkers(ctx context.Context, markers []index.Marker) error {
	if err := p.step(ctx, "SetMarkers"); err != nil {
		return err
	}
	return p.done(p.Backend.SetMarkers(ctx, markers))
}
