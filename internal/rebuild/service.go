package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"time"

	"golang.org/x/sync/errgroup"

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
	// In partitions, every instance follows the live generation every
	// lease TTL (followLive): the previous one is kept two of those.
	every := sc.Lease.TTLOrDefault()
	mc := Config{Runtime: sc.Runtime, Partitions: sc.Partitions}
	if sc.Partitions > 1 {
		mc.DropAfter = 2 * every
	}
	m, err := NewManager(mc, stores, sw, log)
	if err != nil {
		return err
	}
	if err := m.Register(deps.Registry); err != nil {
		return err
	}
	routes := sw.Routes()
	maps.Copy(routes, m.Routes())
	// Rebuilds write the store too: they run while this instance holds
	// its lease, and resume on the instance that takes it over. In
	// partitions, on the instance that holds the coordinator's lease,
	// which takes every partition while it writes alone.
	sc.Alongside = m.RunFenced
	if sc.Partitions < 2 {
		return projector.RunService(ctx, sc, sw, routes, deps)
	}
	js, err := deps.JetStream()
	if err != nil {
		return err
	}
	// Another instance's rebuild may have made another generation live:
	// a partition is taken on the live one, and an instance holding none
	// serves its reads from it within a lease's TTL.
	sc.OnTake = func(ctx context.Context) error {
		_, err := sw.Reopen(ctx, stores, log)
		return err
	}
	eg, gctx := errgroup.WithContext(ctx)
	eg.Go(func() error { m.Open(gctx, js); return nil }) // Start and Status answer on every instance
	eg.Go(func() error { followLive(gctx, sw, stores, every, log); return nil })
	eg.Go(func() error { return projector.RunService(gctx, sc, sw, routes, deps) })
	return eg.Wait()
}

// followLive reopens the live generation under sw every interval, when
// another instance made another one live.
func followLive(ctx context.Context, sw *Switch, stores Stores, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := sw.Reopen(ctx, stores, log); err != nil && ctx.Err() == nil {
			log.Warn("reading which generation of the store is live failed", "err", err)
		}
	}
}

// stopped is nil when ctx was canceled while starting (a stop is not a
// failure).
func stopped(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return err
}
