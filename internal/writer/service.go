package writer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
)

// ServiceConfig is the writer service's configuration.
type ServiceConfig struct {
	PostgresURL   string
	NATSURL       string // empty: no ingest consumer
	HTTPAddr      string
	MetricsAddr   string // empty: no metrics server
	MaxConns      int    // Postgres pool size; default 16
	Migrate       bool   // apply pending migrations at start
	ShutdownGrace time.Duration
	API           APIConfig
	Ingest        IngestConfig
	Store         docstore.Config
	Retention     RetentionConfig
	// OnListen, when set, is called with the API's address once it listens.
	OnListen func(addr net.Addr)
}

// Defaults of the writer service.
const (
	DefaultMaxConns      = 16
	DefaultShutdownGrace = 15 * time.Second
)

// withDefaults fills the settings left zero.
func (c ServiceConfig) withDefaults() ServiceConfig {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	if c.PostgresURL == "" {
		return errors.New("writer: a Postgres URL is required")
	}
	if c.HTTPAddr == "" {
		return errors.New("writer: an HTTP address is required")
	}
	return c.Store.Validate()
}

// Connections are Postgres, a pool of MaxConns, and NATS when ingest is
// on.
func (c ServiceConfig) Connections() service.Conns {
	return service.Conns{Client: "converge-writer", PostgresURL: c.PostgresURL, NATSURL: c.NATSURL,
		PostgresMaxConns: c.withDefaults().MaxConns}
}

// Flags binds the writer's settings to flags and their environment
// variables; call the returned function after parsing.
func Flags(f *config.Flags) func() (ServiceConfig, error) {
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL; when set, documents are also consumed from converge.ingest.>")
	httpAddr := f.String("http-addr", config.EnvHTTPAddr, "127.0.0.1:8080", "address of the document API")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, "127.0.0.1:9101", "address of /metrics, /healthz and /readyz (empty: off)")
	maxConns := f.Int("max-conns", "CONVERGE_WRITER_MAX_CONNS", DefaultMaxConns, "Postgres connections")
	batch := f.Int("batch-size", "CONVERGE_WRITER_BATCH_SIZE", 500, "NDJSON lines per transaction on POST /v1/documents:batch")
	migrate := f.Bool("migrate", "CONVERGE_WRITER_MIGRATE", false, "apply pending schema migrations at start")
	grace := f.Duration("shutdown-grace", "CONVERGE_SHUTDOWN_GRACE", 0, "how long in-flight requests may finish on shutdown (0: 15s)")
	retention := f.Duration("outbox-retention", "CONVERGE_OUTBOX_RETENTION", 24*time.Hour, "delete outbox rows older than this (negative: never); the relay reads WAL, not the table")
	return func() (ServiceConfig, error) {
		if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
			return ServiceConfig{}, err
		}
		c := ServiceConfig{PostgresURL: *pg, NATSURL: *natsURL, HTTPAddr: *httpAddr, MetricsAddr: *metricsAddr,
			MaxConns: *maxConns, Migrate: *migrate, ShutdownGrace: *grace}
		c.API.BatchSize = *batch
		c.Retention.Retention = *retention
		return c, nil
	}
}

// Run runs the writer over deps.Postgres (and, with a NATS URL, the ingest
// consumer over deps.NATS) until ctx ends, then drains in-flight requests
// and stops the ingest consumer.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	log, pool := deps.Log, deps.Postgres
	if pool == nil {
		return errors.New("writer: no Postgres pool")
	}
	if cfg.Migrate {
		st, err := schema.Up(ctx, pool.Config().ConnString())
		if err != nil {
			return err
		}
		log.Info("schema migrated", "version", st.Version)
	}
	store, err := docstore.New(pool, cfg.Store, log)
	if err != nil {
		return err
	}
	metrics := NewMetrics(deps.Registry)
	store.OnRetry(metrics.Retries.Inc)

	checks := []telemetry.Check{
		{Name: "postgres", Func: pool.Ping},
		{Name: "schema", Func: func(ctx context.Context) error {
			st, err := schema.Check(ctx, pool)
			if err != nil {
				return err
			}
			if !st.Current() {
				return fmt.Errorf("schema at version %d, this writer needs %d: run `converge migrate up`", st.Version, st.Latest)
			}
			return nil
		}},
	}

	// Listen before starting anything, so a taken port leaves nothing
	// running behind.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("writer: listen %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("writer API listening", "addr", ln.Addr().String())
	if cfg.OnListen != nil {
		cfg.OnListen(ln.Addr())
	}

	g, ctx := errgroup.WithContext(ctx)
	if cfg.NATSURL != "" {
		js, err := deps.JetStream()
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("writer: jetstream: %w", err)
		}
		checks = append(checks, service.NATSCheck(deps.NATS))
		ingest := NewIngest(js, store, cfg.Ingest, metrics, log.With("component", "ingest"))
		g.Go(func() error { return ingest.Run(ctx) })
	}

	g.Go(func() error {
		RunOutboxRetention(ctx, store, cfg.Retention, metrics, log.With("component", "retention"))
		return nil
	})

	api := NewAPI(store, cfg.API, metrics, log)
	g.Go(func() error { return telemetry.ServeListener(ctx, ln, api, cfg.ShutdownGrace, log) })
	if cfg.MetricsAddr != "" {
		g.Go(func() error {
			return telemetry.Serve(ctx, cfg.MetricsAddr, telemetry.Handler(deps.Registry, checks...), cfg.ShutdownGrace, nil)
		})
	}
	return g.Wait()
}
