package projector

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
)

// ServiceConfig is what a projector process needs besides its store.
type ServiceConfig struct {
	NATSURL     string
	MetricsAddr string // /metrics, /healthz, /readyz and the projector's own routes; empty: off
	Runtime     Config
	// NATSAuth authenticates the projector to NATS (its own user).
	NATSAuth natsauth.ClientConfig
	// Security of the projector's routes: bearer tokens (read for the
	// read APIs, admin for /v1/admin/), TLS, and whether it may serve
	// beyond loopback without tokens. /metrics, /healthz and /readyz stay
	// open.
	Security auth.Settings
	// Prepare, when set, runs before the runtime consumes (its error ends
	// the service), while /healthz is already served and /readyz says the
	// consumer is not created yet: the notifier waits there for its stream
	// and finishes the consumer of an older deployment.
	Prepare func(ctx context.Context, js jetstream.JetStream) error
}

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	if c.NATSURL == "" {
		return errors.New("projector: a NATS URL is required")
	}
	if c.Runtime.Name == "" {
		return errors.New("projector: a name (its durable consumer) is required")
	}
	if err := c.Security.Validate(); err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	return nil
}

// Connections of a projector: NATS alone. A projector holds no Postgres
// credentials.
func (c ServiceConfig) Connections() service.Conns {
	return service.Conns{Client: "converge-projector-" + c.Runtime.Name, NATSURL: c.NATSURL, NATSAuth: c.NATSAuth}
}

// ErrPostgresCredentials is the refusal of a projector (or the notifier)
// started with a Postgres URL: it reads only the stream, so it holds no
// Postgres credentials, and a URL in its environment is a deployment that
// gives it more than its job needs.
var ErrPostgresCredentials = errors.New("a projector holds no Postgres credentials: unset " + config.EnvPostgresURL + " (and " + config.EnvPostgresURL + "_FILE) in its environment")

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
	natsAuth := natsauth.Flags(f)
	security := auth.BindFlags(f)
	return func() (ServiceConfig, error) {
		if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
			return ServiceConfig{}, err
		}
		if pg, _, _ := config.Lookup(config.EnvPostgresURL); pg != "" {
			return ServiceConfig{}, ErrPostgresCredentials
		}
		na, err := natsAuth()
		if err != nil {
			return ServiceConfig{}, err
		}
		return ServiceConfig{NATSURL: *natsURL, MetricsAddr: *addr, NATSAuth: na, Security: security(),
			Runtime: Config{Name: *durable, BatchSize: *batch, Parallel: *parallel, MaxDeliver: *maxDeliver, AckWait: *ackWait}}, nil
	}
}

// routeScope is the scope a projector's route needs: admin under
// /v1/admin/ and for any method that changes state (so that a new route
// fails closed), read for the rest.
func routeScope(pattern string) auth.Scope {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "", pattern
	}
	if strings.HasPrefix(path, "/v1/admin/") || (method != http.MethodGet && method != http.MethodHead) {
		return auth.Admin
	}
	return auth.Read
}

// RunService runs a projector over store on deps.NATS until ctx ends,
// serving /metrics, /healthz, /readyz and routes (pattern -> handler) on
// the metrics address; with tokens, each route needs its scope (see
// routeScope), and the tokens file is reloaded on SIGHUP.
func RunService(ctx context.Context, sc ServiceConfig, store Store, routes map[string]http.Handler, deps service.Deps) error {
	deps = deps.WithDefaults()
	tokens, err := sc.Security.Tokens()
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	if sc.MetricsAddr != "" && len(routes) > 0 {
		if err := auth.CheckListen(sc.MetricsAddr, tokens, sc.Security.InsecureNoAuth); err != nil {
			return fmt.Errorf("projector: %w", err)
		}
	}
	tlsConfig, err := sc.Security.TLS().Config()
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	js, err := deps.JetStream()
	if err != nil {
		return err
	}
	r, err := New(js, store, sc.Runtime, NewMetrics(deps.Registry, sc.Runtime.Name), deps.Log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if sc.Prepare != nil {
			if err := sc.Prepare(ctx, js); err != nil {
				return err
			}
		}
		return r.Run(ctx)
	})
	if tokens.Enabled() {
		g.Go(func() error { tokens.Watch(ctx, deps.Log.With("component", "auth")); return nil })
	}
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
		guard := auth.NewGuard(tokens, deps.Registry, deps.Log.With("component", "auth"))
		mux := http.NewServeMux()
		mux.Handle("/", telemetry.Handler(deps.Registry, checks...))
		for pattern, h := range routes {
			mux.Handle(pattern, guard.Require(routeScope(pattern), h))
		}
		g.Go(func() error {
			return telemetry.Serve(ctx, sc.MetricsAddr, mux, 5*time.Second, nil, telemetry.WithTLS(tlsConfig))
		})
	}
	return g.Wait()
}
