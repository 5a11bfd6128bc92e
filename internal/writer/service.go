package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/telemetry"
)

// ServiceConfig wires the writer service.
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

// RunService runs the writer until ctx ends, then drains in-flight requests
// and stops the ingest consumer.
func RunService(ctx context.Context, cfg ServiceConfig, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 15 * time.Second
	}
	if cfg.Migrate {
		st, err := schema.Up(ctx, cfg.PostgresURL)
		if err != nil {
			return err
		}
		log.Info("schema migrated", "version", st.Version)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("writer: postgres url: %w", err)
	}
	pcfg.MaxConns = int32(max(cfg.MaxConns, 1))
	if cfg.MaxConns == 0 {
		pcfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("writer: connect postgres: %w", err)
	}
	defer pool.Close()
	store, err := docstore.New(pool, cfg.Store, log)
	if err != nil {
		return err
	}
	reg := telemetry.NewRegistry()
	metrics := NewMetrics(reg)
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
		nc, err := nats.Connect(cfg.NATSURL, nats.Name("converge-writer"), nats.MaxReconnects(-1))
		if err != nil {
			return fmt.Errorf("writer: connect nats: %w", err)
		}
		defer drain(nc, log)
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("writer: jetstream: %w", err)
		}
		checks = append(checks, telemetry.Check{Name: "nats", Func: func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("nats: %s", nc.Status())
			}
			return nil
		}})
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
			return telemetry.Serve(ctx, cfg.MetricsAddr, telemetry.Handler(reg, checks...), cfg.ShutdownGrace, nil)
		})
	}
	return g.Wait()
}

// drain lets the ingest consumer's last acknowledgements reach the server
// before the connection closes, waiting a bounded time for it.
func drain(nc *nats.Conn, log *slog.Logger) {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		log.Warn("nats drain timed out")
		nc.Close()
	}
}
