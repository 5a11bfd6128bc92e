package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/retry"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
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
	// Alongside, when set, runs beside the runtime while this instance
	// holds the store's lease, and is cancelled when it loses it: the
	// rebuilds, which write the store too, each write behind fence (the
	// runtime's own Config.Fence and Config.Bound); exclusive is nil. In
	// partitions, it runs on the one instance holding the lease
	// <name>.rebuild (CoordinatorLease), fence being that lease's term,
	// and exclusive takes every partition when it must write alone.
	Alongside func(ctx context.Context, js jetstream.JetStream, fence Fencing, exclusive Exclusive) error
	// OnTake, when set, runs in partitions each time this instance takes
	// a partition, before the partition's runtime writes: an instance
	// that held every partition may have made another generation of the
	// store live (a rebuild) meanwhile.
	OnTake func(ctx context.Context) error
	// Lease makes this instance the store's only writer while others of
	// the same name stand by (see internal/lease).
	Lease LeaseConfig
	// Partitions, when 2 or more, has the instances of this projector
	// share its store by partition (see partitions.go): the number of the
	// partitioned stream (contract.PartsStream), the same for every
	// instance. 0 or 1: one writer, instances standing by.
	Partitions int
	// Unpartitioned is a service that never runs in partitions: its one
	// writer does not look for the partitions' mark.
	Unpartitioned bool
	// Source, when set, is where the partitions' events come from other
	// than the partitioned stream (the notifier's: a work queue per
	// partition).
	Source *PartitionSource
}

// PartitionSource is where a partitioned service's events come from, when
// not from the partitioned stream (contract.PartsStream).
type PartitionSource struct {
	// Runtime is partition p's runtime configuration, made from rc, the
	// service's.
	Runtime func(rc Config, p int) Config
	// Wait waits for the partitions' streams and checks that they are n;
	// nil when ctx ends.
	Wait func(ctx context.Context, js jetstream.JetStream, n int) error
	// Move takes over from the service's one writer, called while this
	// instance holds the one writer's lease (term), before any partition
	// runs; called again while it fails.
	Move func(ctx context.Context, js jetstream.JetStream, term Fencing, writable func() bool) error
}

// LeaseConfig is how instances of one projector share its store.
type LeaseConfig struct {
	// TTL is how long a standby waits for the writer's renewal before it
	// takes over; default lease.DefaultTTL.
	TTL time.Duration
	// Replicas of the leases' bucket; default 1.
	Replicas int
	// Holder names this instance, the same across its restarts; default
	// the host and the metrics address (see lease.Config.Holder).
	Holder string
}

// TTLOrDefault is the lease's TTL, lease.DefaultTTL when unset.
func (c LeaseConfig) TTLOrDefault() time.Duration {
	if c.TTL <= 0 {
		return lease.DefaultTTL
	}
	return c.TTL
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
	batch := f.Int("batch", "CONVERGE_PROJECTOR_BATCH", DefaultBatchSize, "messages fetched and applied at once")
	parallel := f.Int("parallel", "CONVERGE_PROJECTOR_PARALLEL", DefaultParallel, "shards of a batch applied at once")
	maxDeliver := f.Int("max-deliver", "CONVERGE_PROJECTOR_MAX_DELIVER", DefaultMaxDeliver, "deliveries after which an event the store rejects is dead-lettered")
	ackWait := f.Duration("ack-wait", "CONVERGE_PROJECTOR_ACK_WAIT", DefaultAckWait,
		"the consumer's redelivery timeout (extended while a batch is applied); an instance taking over, or restarted, has what the last one held delivered again at once")
	leaseTTL := f.Duration("lease-ttl", "CONVERGE_LEASE_TTL", lease.DefaultTTL,
		"how long a standby instance of this projector waits for the writer's lease renewal before it takes over")
	replicas := f.Replicas() // the leases, the dead letters, the rebuilds' state, the notifier's dedup store
	natsAuth := natsauth.Flags(f)
	security := auth.BindFlags(f)
	return func() (ServiceConfig, error) {
		if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
			return ServiceConfig{}, err
		}
		if pg, _, _ := f.Env(config.EnvPostgresURL); pg != "" {
			return ServiceConfig{}, ErrPostgresCredentials
		}
		na, err := natsAuth()
		if err != nil {
			return ServiceConfig{}, err
		}
		return ServiceConfig{NATSURL: *natsURL, MetricsAddr: *addr, NATSAuth: na, Security: security(),
			Runtime: Config{Name: *durable, BatchSize: *batch, Parallel: *parallel, MaxDeliver: *maxDeliver, AckWait: *ackWait, Replicas: *replicas},
			Lease:   LeaseConfig{TTL: *leaseTTL, Replicas: *replicas}}, nil
	}
}

// PartitionsFlag binds -partitions (CONVERGE_PARTITIONS) of a projector
// whose store every instance shares (Qdrant, Neo4j): see
// ServiceConfig.Partitions.
func PartitionsFlag(f *config.Flags) *int {
	return f.Int("partitions", config.EnvPartitions, 0,
		"share the store among this projector's instances by partition: the number of partitions of the partitioned stream (`converge streams apply -partitions N`), the same for every instance; 0: one instance writes, the others stand by")
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
		if err := sc.Security.CheckListen(sc.MetricsAddr, tokens); err != nil {
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
	if sc.Runtime.Clock == nil {
		sc.Runtime.Clock = deps.Clock
	}
	var work func(context.Context) error
	var ready func() error
	if sc.Partitions > 1 {
		p, err := newPartitioned(sc, js, store, deps)
		if err != nil {
			return err
		}
		work, ready = p.run, p.ready
	} else {
		h, err := newHolder(sc, sc.Runtime, js, store, deps, nil)
		if err != nil {
			return err
		}
		work, ready = h.run, h.ready
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return work(ctx) })
	if tokens.Enabled() {
		g.Go(func() error { tokens.Watch(ctx, deps.Log.With("component", "auth")); return nil })
	}
	if sc.MetricsAddr != "" {
		checks := []telemetry.Check{
			service.NATSCheck(deps.NATS),
			{Name: "consumer", Func: func(context.Context) error { return ready() }},
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

// holder runs the runtime while this instance holds the store's lease (or
// a partition's), and stands by while another does.
type holder struct {
	sc      ServiceConfig
	js      jetstream.JetStream
	r       *Runtime
	metrics *Metrics
	term    *atomic.Pointer[lease.Term]
	log     *slog.Logger
	standby atomic.Bool
	// part, for a partition's holder: whether this instance should hold
	// it, and when to ask again. Nil: the store's one writer, which
	// stops when the deployment has moved to partitions.
	part *lease.Members
	// leaseKey is the lease's key: the runtime's name by default.
	leaseKey string
	lease    *lease.Lease // once opened
}

// leaseName is the key of the lease this holder takes.
func (h *holder) leaseName() string {
	if h.leaseKey != "" {
		return h.leaseKey
	}
	return h.sc.Runtime.Name
}

// newHolder is the holder of the runtime rc over store, with its fence
// (the lease rc.Name), its metrics and its runtime; part is the members
// that decide whether a partition's holder should hold it (nil: not a
// partition).
func newHolder(sc ServiceConfig, rc Config, js jetstream.JetStream, store Store, deps service.Deps, part *lease.Members) (*holder, error) {
	var term atomic.Pointer[lease.Term]
	rc.Fence = func(ctx context.Context) error {
		t := term.Load()
		if t == nil {
			return lease.ErrLost
		}
		return t.Check(ctx)
	}
	rc.Writable = func() bool {
		t := term.Load()
		return t != nil && t.Valid()
	}
	rc.Bound = func(ctx context.Context) (context.Context, context.CancelFunc) {
		if t := term.Load(); t != nil {
			return t.Bound(ctx)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		cancel(lease.ErrLost)
		return ctx, func() {}
	}
	metrics := NewMetrics(deps.Registry, rc.Name)
	r, err := New(js, store, rc, metrics, deps.Log)
	if err != nil {
		return nil, err
	}
	sc.Runtime = r.cfg
	return &holder{sc: sc, js: js, r: r, metrics: metrics, term: &term, part: part, log: deps.Log.With("projector", rc.Name)}, nil
}

// ready is nil once the runtime's consumer exists, or while this instance
// stands by, ready to take over.
func (h *holder) ready() error {
	if h.standby.Load() {
		return nil
	}
	select {
	case <-h.r.Ready():
		return nil
	default:
		return errors.New("consumer not created yet")
	}
}

// holderName is this instance's name in the leases: the configured one,
// or the host and the metrics address, the same across restarts and
// different for two instances on one host.
func holderName(sc ServiceConfig) string {
	if sc.Lease.Holder != "" || sc.MetricsAddr == "" {
		return sc.Lease.Holder
	}
	host, _ := os.Hostname()
	return host + "/" + sc.MetricsAddr
}

func (h *holder) run(ctx context.Context) error {
	name := h.leaseName()
	var l *lease.Lease
	for attempt := 1; ; attempt++ {
		var err error
		lc := lease.Config{Name: name, TTL: h.sc.Lease.TTL, Replicas: h.sc.Lease.Replicas, Holder: holderName(h.sc), Clock: h.r.cfg.Clock}
		if h.part != nil {
			lc.Want = func() bool { return h.part.Wants(name) }
		}
		l, err = lease.Open(ctx, h.js, lc, h.log)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		h.log.Warn("opening the leases' bucket failed; trying again", "err", err)
		_ = retry.Sleep(ctx, retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(attempt))
	}
	h.lease = l
	prepared := false
	for {
		if h.part != nil {
			// A partition this instance does not hold (yet, or any more):
			// another writes it, or will.
			h.metrics.Standby.Set(1)
		}
		t, err := l.Acquire(ctx, func(v lease.Value) {
			h.standby.Store(true)
			h.metrics.Standby.Set(1)
			h.log.Info("standing by: another instance writes the store", "writer", v.Holder, "since", v.Since)
		})
		if err != nil {
			return nil // ctx ended
		}
		if h.part == nil && !h.sc.Unpartitioned {
			// A deployment moved to partitions: the store's one writer
			// must not write beside the partitions' (see partitioned),
			// nor before it knows it has not.
			if err := partitionedNow(ctx, l); err != nil {
				t.Release()
				if errors.Is(err, ErrPartitioned) {
					return err
				}
				h.log.Warn("the partitions' mark cannot be read; taking the lease again", "err", err)
				_ = retry.Sleep(ctx, time.Second)
				continue
			}
		}
		h.standby.Store(false)
		h.metrics.Standby.Set(0)
		h.metrics.Takeovers.Inc()
		h.term.Store(t)
		began := time.Now()
		err = h.hold(ctx, t, &prepared)
		h.term.Store(nil)
		t.Release()
		if ctx.Err() != nil {
			return nil
		}
		var fe *FencedError
		switch {
		case errors.Is(err, errUnwanted):
			h.log.Info("handed the partition over to the instance that should hold it", "held_for", time.Since(began).Round(time.Millisecond))
		case errors.Is(err, errTake):
			h.log.Warn("releasing the partition: it cannot be written yet; taking it again", "err", err)
			_ = retry.Sleep(ctx, time.Second)
		case errors.As(err, &fe), errors.Is(err, lease.ErrLost):
			h.log.Error("lost the store's lease; standing by", "held_for", time.Since(began).Round(time.Millisecond), "err", err)
		case err != nil:
			return err
		}
	}
}

// errTake is the failure of ServiceConfig.OnTake: the partition is
// released, and taken again.
var errTake = errors.New("projector: preparing to write partition")

// hold is one term: the previous writer's unacknowledged messages are
// delivered again at once, then the runtime (and Alongside) run until ctx
// ends or the term is lost.
func (h *holder) hold(ctx context.Context, t *lease.Term, prepared *bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go h.watchTerm(ctx, t, cancel)
	if h.part != nil && h.sc.OnTake != nil {
		if err := h.sc.OnTake(ctx); err != nil {
			if c := context.Cause(ctx); errors.Is(c, lease.ErrLost) || errors.Is(c, errUnwanted) {
				return c
			}
			return fmt.Errorf("%w %s: %w", errTake, h.leaseName(), err)
		}
	}
	if h.sc.Prepare != nil && !*prepared {
		if err := h.sc.Prepare(ctx, h.js); err != nil {
			if c := context.Cause(ctx); errors.Is(c, lease.ErrLost) {
				return c
			}
			return err
		}
		*prepared = true
	}
	// First unpin the previous writer (its pull requests left on the server
	// are refused from now on), then have everything it did not
	// acknowledge delivered again: to this instance, whose pulls get the
	// new pin.
	if err := h.r.unpin(ctx); err != nil {
		h.log.Warn("unpinning the previous writer failed", "err", err)
	}
	h.resetConsumer(ctx)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return h.r.Run(gctx) })
	if h.sc.Alongside != nil && h.part == nil { // in partitions, the coordinator runs it
		g.Go(func() error {
			return h.sc.Alongside(gctx, h.js, Fencing{Fence: h.r.cfg.Fence, Bound: h.r.cfg.Bound}, nil)
		})
	}
	err := g.Wait()
	if c := context.Cause(ctx); err == nil && (errors.Is(c, lease.ErrLost) || errors.Is(c, errUnwanted) || errors.Is(c, ErrPartitioned)) {
		return c
	}
	return err
}

// resetConsumer has the server deliver again, at once, every message of
// the consumer not acknowledged yet: those the previous writer held when
// it died or was fenced would otherwise wait for their ack wait. The
// versions guards skip what was written already.
func (h *holder) resetConsumer(ctx context.Context) {
	stream := h.sc.Runtime.Stream
	if stream == "" {
		stream = contract.DocsStream
	}
	cons, err := h.js.Consumer(ctx, stream, h.sc.Runtime.Name)
	if err != nil {
		return // none yet (the runtime creates it), or unreadable: nothing to reset
	}
	// What it had delivered and not acknowledged: owed to the runtime,
	// which the reset would otherwise hide from its gap detector.
	h.r.TookOver(cons.CachedInfo())
	resp, err := h.js.ResetConsumer(ctx, stream, h.sc.Runtime.Name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		h.log.Warn("resetting the consumer failed: what the previous writer held is delivered again after its ack wait", "err", err)
	default:
		h.log.Info("took the store's lease: the consumer delivers again from its acknowledgement floor", "from_seq", resp.ResetSeq)
	}
}
