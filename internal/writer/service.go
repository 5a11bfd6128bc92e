package writer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/natsauth"
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
	// Inbox drains converge_inbox, the documents producers hand over in
	// their own transactions, unless Off.
	Inbox InboxConfig
	// TokensFile names the bearer tokens the API accepts (see package
	// auth), reloaded on SIGHUP; empty: no authentication, which Run
	// allows only on a loopback HTTPAddr unless InsecureNoAuth.
	TokensFile     string
	InsecureNoAuth bool
	// InsecurePlainHTTP lets the API accept tokens over plain HTTP
	// beyond loopback (see auth.CheckPlainHTTP).
	InsecurePlainHTTP bool
	// TLSCert and TLSKey name the key pair of the API and metrics
	// listeners; both empty: plain HTTP.
	TLSCert, TLSKey string
	// NATSAuth authenticates the ingest consumer to NATS.
	NATSAuth natsauth.ClientConfig
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
	if err := c.security().Validate(); err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	return c.Store.Validate()
}

func (c ServiceConfig) security() auth.Settings {
	return auth.Settings{TokensFile: c.TokensFile, TLSCert: c.TLSCert, TLSKey: c.TLSKey, InsecureNoAuth: c.InsecureNoAuth, InsecurePlainHTTP: c.InsecurePlainHTTP}
}

// Connections are Postgres, a pool of MaxConns, and NATS when ingest is
// on.
func (c ServiceConfig) Connections() service.Conns {
	return service.Conns{Client: "converge-writer", PostgresURL: c.PostgresURL, NATSURL: c.NATSURL,
		PostgresMaxConns: c.withDefaults().MaxConns, NATSAuth: c.NATSAuth}
}

// The writer's default addresses: its API's and its metrics'.
const (
	DefaultHTTPAddr    = "127.0.0.1:8080"
	DefaultMetricsAddr = "127.0.0.1:9101"
)

// Flags binds the writer's settings to flags and their environment
// variables; call the returned function after parsing.
func Flags(f *config.Flags) func() (ServiceConfig, error) {
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL; when set, documents are also consumed from converge.ingest.>")
	httpAddr := f.String("http-addr", config.EnvHTTPAddr, DefaultHTTPAddr, "address of the document API")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, DefaultMetricsAddr, "address of /metrics, /healthz and /readyz (empty: off)")
	maxConns := f.Int("max-conns", "CONVERGE_WRITER_MAX_CONNS", DefaultMaxConns, "Postgres connections")
	batch := f.Int("batch-size", "CONVERGE_WRITER_BATCH_SIZE", DefaultAPIBatchSize, "NDJSON lines per transaction on POST /v1/documents:batch")
	migrate := f.Bool("migrate", "CONVERGE_WRITER_MIGRATE", false, "apply pending schema migrations at start")
	grace := f.Duration("shutdown-grace", "CONVERGE_SHUTDOWN_GRACE", 0, "how long in-flight requests may finish on shutdown (0: "+DefaultShutdownGrace.String()+")")
	ackWait := f.Duration("ack-wait", "CONVERGE_WRITER_ACK_WAIT", DefaultIngestAckWait,
		"how long an ingest message stays with a writer that took it before it is delivered again (a writer that died holds it that long)")
	retention := f.Duration("outbox-retention", "CONVERGE_OUTBOX_RETENTION", DefaultOutboxRetention, "delete outbox rows older than this (negative: never); the relay reads WAL, not the table")
	inbox := f.Bool("inbox", "CONVERGE_WRITER_INBOX", true, "apply the documents producers hand over in their own transactions (converge_inbox), woken by LISTEN/NOTIFY")
	inboxBatch := f.Int("inbox-batch", "CONVERGE_WRITER_INBOX_BATCH", DefaultInboxBatch, "handed-over documents applied per transaction")
	inboxParallel := f.Int("inbox-parallel", "CONVERGE_WRITER_INBOX_PARALLEL", DefaultInboxParallel, "transactions applying handed-over documents at once")
	replicas := f.Replicas() // the ingest stream and its dead letters
	security := auth.BindFlags(f)
	natsAuth := natsauth.Flags(f)
	return func() (ServiceConfig, error) {
		if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
			return ServiceConfig{}, err
		}
		c := ServiceConfig{PostgresURL: *pg, NATSURL: *natsURL, HTTPAddr: *httpAddr, MetricsAddr: *metricsAddr,
			MaxConns: *maxConns, Migrate: *migrate, ShutdownGrace: *grace}
		c.API.BatchSize = *batch
		c.Ingest.AckWait, c.Ingest.Replicas = *ackWait, *replicas
		c.Retention.Retention = *retention
		c.Inbox.Off, c.Inbox.BatchSize, c.Inbox.Parallel = !*inbox, *inboxBatch, *inboxParallel
		sec := security()
		c.TokensFile, c.InsecureNoAuth, c.TLSCert, c.TLSKey = sec.TokensFile, sec.InsecureNoAuth, sec.TLSCert, sec.TLSKey
		c.InsecurePlainHTTP = sec.InsecurePlainHTTP
		var err error
		c.NATSAuth, err = natsAuth()
		return c, err
	}
}

// Run runs the writer over deps.Postgres (and, with a NATS URL, the ingest
// consumer over deps.NATS) until ctx ends, then drains in-flight requests
// and stops the ingest consumer. With a tokens file, the API checks bearer
// tokens and reloads the file on SIGHUP; without one, it refuses to listen
// beyond loopback unless InsecureNoAuth. With a key pair, the API and the
// metrics address speak TLS.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	deps = deps.WithDefaults()
	log, pool := deps.Log, deps.Postgres
	// Who may call the API, and over what, is settled before anything
	// touches the database.
	tokens, err := cfg.security().Tokens()
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	if err := cfg.security().CheckListen(cfg.HTTPAddr, tokens); err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	tlsConfig, err := cfg.security().TLS().Config()
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	serveTLS := telemetry.WithTLS(tlsConfig)

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
	log.Info("writer API listening", "addr", ln.Addr().String(), "tls", tlsConfig != nil, "tokens", tokens.Len())
	if !tokens.Enabled() && !auth.Loopback(cfg.HTTPAddr) {
		log.Warn("the writer API accepts unauthenticated requests from the network (-insecure-no-auth)", "addr", cfg.HTTPAddr)
	}
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
	if !cfg.Inbox.Off {
		inbox := NewInbox(deps.Postgres, store, cfg.Inbox, metrics, log.With("component", "inbox"))
		g.Go(func() error { return inbox.Run(ctx) })
	}

	if tokens.Enabled() {
		g.Go(func() error {
			tokens.Watch(ctx, log.With("component", "auth"))
			return nil
		})
	}

	apiCfg := cfg.API
	apiCfg.Guard = auth.NewGuard(tokens, deps.Registry, log.With("component", "auth"))
	api := NewAPI(store, apiCfg, metrics, log)
	g.Go(func() error { return telemetry.ServeListener(ctx, ln, api, cfg.ShutdownGrace, log, serveTLS) })
	if cfg.MetricsAddr != "" {
		// /metrics, /healthz and /readyz stay open: probes and scrapers
		// carry no token, and none of them changes anything.
		g.Go(func() error {
			return telemetry.Serve(ctx, cfg.MetricsAddr, telemetry.Handler(deps.Registry, checks...), cfg.ShutdownGrace, nil, serveTLS)
		})
	}
	return g.Wait()
}
