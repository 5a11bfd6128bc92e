package rebuild

import (
	"context"
	"errors"
	"maps"
	"net/http"

	"github.com/converge-sync/converge/internal/httpjson"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/service"
)

// RunService is a projector process whose projection can be rebuilt: it
// opens the live generation of stores, runs the projector runtime over it
// (see [projector.RunService]) with the generation's read routes and the
// rebuild routes, and resumes or runs rebuilds, until ctx ends; the
// rebuilds and the runtime share deps.NATS.
func RunService(ctx context.Context, sc projector.ServiceConfig, stores Stores, deps service.Deps) error {
	deps = deps.WithDefaults()
	log := deps.Log
	live, err := stores.Live(ctx)
	if err != nil {
		return stopped(ctx, err)
	}
	g, err := stores.Open(ctx, live)
	if err != nil {
		return stopped(ctx, err)
	}
	sw := NewSwitch(g)
	defer func() { _ = sw.Close() }()
	log.Info("projection store", "store", stores.Describe(live))

	if sc.Runtime.Clock == nil {
		sc.Runtime.Clock = deps.Clock
	}
	m, err := NewManager(Config{Runtime: sc.Runtime}, stores, sw, log)
	if err != nil {
		return err
	}
	if err := m.Register(deps.Registry); err != nil {
		return err
	}
	routes := sw.Routes()
	maps.Copy(routes, m.Routes())
	if sc.Partitions > 1 {
		// The partitions' writers run in several processes, which a
		// rebuild would have to hold back together.
		routes["POST "+AdminPath] = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			httpjson.Error(w, http.StatusServiceUnavailable, "rebuild_unavailable", ErrPartitioned.Error())
		})
		return projector.RunService(ctx, sc, sw, routes, deps)
	}
	// Rebuilds write the store too: they run while this instance holds
	// its lease, and resume on the instance that takes it over.
	sc.Alongside = m.RunFenced
	return projector.RunService(ctx, sc, sw, routes, deps)
}

// ErrPartitioned refuses a rebuild of a projector running in partitions.
var ErrPartitioned = errors.New("rebuild: a projector running in partitions is not rebuilt by its instances (its writers run in several processes): mend what differs with `converge verify -repair`, or have every partition read the stream again with `converge replay <name> -partitions N -from-seq 1`")

// stopped is nil when ctx was canceled while starting (a stop is not a
// failure).
func stopped(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return err
}
