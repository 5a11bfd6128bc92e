package rebuild

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Generation is one copy of a projection: a store the runtime writes to,
// the read routes that serve it, and how to close it.
type Generation struct {
	// Name identifies the generation in its store: a directory under the
	// data directory, a Qdrant collection, or the one Neo4j database.
	Name string
	// Store is what the projector runtime applies events to.
	Store projector.Store
	// Routes are the read routes of the projector process (pattern ->
	// handler) served from this generation.
	Routes map[string]http.Handler
	// Close releases the generation's store; nil when there is nothing to
	// close.
	Close func() error

	readers sync.RWMutex // read requests in flight hold it shared; closing holds it whole
	closed  bool         // under readers
}

func (g *Generation) close() error {
	g.readers.Lock() // wait for the reads in flight
	defer g.readers.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.Close == nil {
		return nil
	}
	return g.Close()
}

// Switch is the store the live projector runtime writes to: the live
// generation, which a rebuild replaces in one step. It can also hold the
// live runtime's writes back (Pause) while a rebuild catches up, so that a
// store never has two writers.
type Switch struct {
	writes sync.RWMutex // Apply holds it shared; Pause holds it whole
	mu     sync.Mutex
	live   *Generation
}

var _ projector.Store = (*Switch)(nil)

// NewSwitch returns a switch on the live generation g.
func NewSwitch(g *Generation) *Switch { return &Switch{live: g} }

// Live is the live generation.
func (s *Switch) Live() *Generation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// Apply applies the events to the live generation, waiting while the
// switch is paused.
func (s *Switch) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	s.writes.RLock()
	defer s.writes.RUnlock()
	return s.Live().Store.Apply(ctx, events)
}

// Prepare lets the live generation's store prepare a batch ahead of its
// Apply, when it can (projector.Preparer).
func (s *Switch) Prepare(ctx context.Context, events []*contract.Event) {
	if p, ok := s.Live().Store.(projector.Preparer); ok {
		p.Prepare(ctx, events)
	}
}

// Forget has the live generation's store drop what it prepared for ctx's
// runtime, when it can (projector.Forgetter).
func (s *Switch) Forget(ctx context.Context) {
	if f, ok := s.Live().Store.(projector.Forgetter); ok {
		f.Forget(ctx)
	}
}

// Pause waits for the store calls in progress and holds further ones back
// until the returned function is called.
func (s *Switch) Pause() (resume func()) {
	s.writes.Lock()
	var once sync.Once
	return func() { once.Do(s.writes.Unlock) }
}

// replace makes g the live generation and returns the previous one. The
// caller holds the switch paused.
func (s *Switch) replace(g *Generation) *Generation {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.live
	s.live = g
	return prev
}

// Routes returns handlers for the live generation's route patterns that
// serve each request from whichever generation is live when it arrives.
func (s *Switch) Routes() map[string]http.Handler {
	routes := make(map[string]http.Handler)
	for pattern := range s.Live().Routes {
		routes[pattern] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g := s.Live()
			g.readers.RLock()
			for g.closed { // replaced and closed since: take the new one
				g.readers.RUnlock()
				g = s.Live()
				g.readers.RLock()
			}
			defer g.readers.RUnlock()
			h, ok := g.Routes[pattern]
			if !ok {
				http.NotFound(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	return routes
}

// Reopen makes the generation that stores name live the switch's, when
// it is another (made live by another instance: a partitioned projector's
// rebuild runs on one of them), holding the writes back meanwhile. It
// reports whether it did.
func (s *Switch) Reopen(ctx context.Context, stores Stores, log *slog.Logger) (bool, error) {
	live, err := stores.Live(ctx)
	if err != nil || live == s.Live().Name {
		return false, err
	}
	resume := s.Pause()
	defer resume()
	// Again, held back: this instance's own rebuild may have swapped it
	// in meanwhile.
	if live, err = stores.Live(ctx); err != nil || live == s.Live().Name {
		return false, err
	}
	g, err := stores.Open(ctx, live)
	if err != nil {
		return false, fmt.Errorf("rebuild: open the live generation %s: %w", stores.Describe(live), err)
	}
	prev := s.swapIn(g, resume, stores, log)
	log.Info("another instance made another generation live: writing and reading it", "live", stores.Describe(live), "was", stores.Describe(prev))
	return true, nil
}

// swapIn makes g the live generation (the caller holds the switch
// paused), lets the writes go on with resume, closes the generation it
// replaced and returns that one's name.
func (s *Switch) swapIn(g *Generation, resume func(), stores Stores, log *slog.Logger) string {
	prev := s.replace(g)
	resume()
	if err := prev.close(); err != nil {
		log.Warn("closing the previous generation failed", "previous", stores.Describe(prev.Name), "err", err)
	}
	return prev.Name
}

// Close closes the live generation.
func (s *Switch) Close() error { return s.Live().close() }
