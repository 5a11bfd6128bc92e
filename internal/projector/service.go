package projector

import (
	"context"
	"errors"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
)

// ServiceConfig is what a projector process needs besides its store.
type ServiceConfig struct {
	NATSURL     string
	MetricsAddr string // /metrics, /healthz, /readyz and the projector's own routes; empty: off
	Runtime     Config
}

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	if c.NATSURL == "" {
		return errors.New("projector: a NATS URL is required")
	}
	if c.Runtime.Name == "" {
		return errors.New("projector: a name (its durable consumer) is required")
	}
	return nil
}

// Connections of a projector: NATS alone. A projector holds no Postgres
// credentials.
func (c ServiceConfig) Connections() service.Conns {
	return service.Conns{Client: "converge-projector-" + c.Runtime.Name, NATSURL: c.NATSURL}
}

// ServiceFlags binds a projector process's common flags; call the returned
// function after parsing. name and metricsAddr are the defaults of -name
// and -metrics-addr.
func ServiceFlags(f *config.Flags, name, metricsAddr string) func() (ServiceConfig, error) {
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	addr := f.String("metrics-addr", config.EnvMetricsAddr, metricsAddr, "address of /metrics, /healthz, /readyz and the projector's read API (empty: off)")
	durable := f.String("name", "CONVERGE_PROJECTOR_NAME", name, "durable consumer name; dead letters go to converge.dlq.<name>")
	batch := f.Int("batch", "CONVERGE_PROJECTOR_BATCH", 256, "messages fetched and applied at once")
	parallel := f.Int("parallel", "CONVERGE_PROJECTOR_PARALLEL", 2, "shards of a batch applied at once")
	maxDeliver := f.Int("max-deliver", "CONVERGE_PROJECTOR_MAX_DELIVER", 5, "deliveries after which an event the store rejects is dead-lettered")
	ackWait := f.Duration("ack-wait", "CONVERGE_PROJECTOR_ACK_WAIT", 60*time.Second,
		"the consumer's redelivery timeout: how long events delivered to a process that died wait before they are delivered again (extended while a batch is applied)")
	return func() (ServiceConfig, error) {
		if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
			return ServiceConfig{}, err
		}
		return ServiceConfig{NATSURL: *natsURL, MetricsAddr: *addr,
			Runtime: Config{Name: *durable, BatchSize: *batch, Parallel: *parallel, MaxDeliver: *maxDeliver, AckWait: *ackWait}}, nil
	}
}

// RunService runs a projector over store on deps.NATS until ctx ends,
// serving /metrics, /healthz, /readyz and routes (pattern -> handler) on
// the metrics address.
func RunService(ctx context.Context, sc ServiceConfig, store Store, routes map[string]http.Handler, deps service.Deps) error {
	js, err := deps.JetStream()
	if err != nil {
		return err
	}
	r, err := New(js, store, sc.Runtime, NewMetrics(deps.Registry, sc.Runtime.Name), deps.Log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) })
	if sc.MetricsAddr != "" {
		checks := []telemetry.Check{
			service.NATSCheck(deps.NATS),
			{Name: "consumer", Func: func(context.Context) error {
				select {
				case <-r.Ready():
					return nil
				default:
					return errors.New("consumer not created yet")
				}
			}},
		}
		mux := http.NewServeMux()
		mux.Handle("/", telemetry.Handler(deps.Registry, checks...))
		for pattern, h := range routes {
			mux.Handle(pattern, h)
		}
		g.Go(func() error { return telemetry.Serve(ctx, sc.MetricsAddr, mux, 5*time.Second, nil) })
	}
	return g.Wait()
}
