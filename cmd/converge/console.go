package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/console"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/writer"
)

// defaultConsoleAddr is where converge console serves its page and API.
const defaultConsoleAddr = "127.0.0.1:9107"

// consoleCmd is converge console: the operator's web page over the
// pipeline, until ctx ends.
func consoleCmd(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge console")
	addr := f.String("addr", "CONVERGE_CONSOLE_ADDR", defaultConsoleAddr, "address of the console's page and API (beyond loopback only with -tokens-file)")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL (the read-only role of converge status is enough)")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL (the operator's user, as converge status and dlq)")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", relay.DefaultSlot, "the relay's replication slot")
	writerURL := f.String("writer-url", envWriterURL, "http://127.0.0.1:8080", "the writer's API, which re-emits the documents of CONVERGE_DOCS's dead letters redriven")
	writerMetrics := f.String("writer-metrics-addr", "CONVERGE_CONSOLE_WRITER_METRICS_ADDR", writer.DefaultMetricsAddr, "the writer's metrics address, for its rate (empty: not read)")
	relayMetrics := f.String("relay-metrics-addr", "CONVERGE_CONSOLE_RELAY_METRICS_ADDR", relay.DefaultMetricsAddr, "the relay's metrics address, for its rate (empty: not read)")
	indexAddr := indexAddrFlag(f, ", for its rate, its lease and its rebuild (empty: not read)")
	graphAddr := graphAddrFlag(f, ", for its rate, its lease and its rebuild (empty: not read)")
	verifyAddr := f.String("verify-addr", "CONVERGE_VERIFY_METRICS_ADDR", defaultVerifyMetricsAddr, "the address of converge verify -watch (its -metrics-addr), for the stores' agreement (empty: not shown)")
	interval := f.Duration("interval", "CONVERGE_CONSOLE_INTERVAL", console.DefaultInterval, "how often the pipeline is read (and the page refreshed)")
	deadLetters := f.Int("dead-letters", "CONVERGE_CONSOLE_DEAD_LETTERS", console.DefaultDeadLetterLimit, "dead letters shown per consumer, oldest first")
	ca := f.String("tls-ca", auth.EnvTLSCA, "", "PEM file of the CA certificates of the services' https:// addresses (empty: the system's roots)")
	security := auth.BindFlags(f)
	natsAuth := natsauth.Flags(f)
	logLevel := f.String("log-level", config.EnvLogLevel, "info", "debug, info, warn or error")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return service.Usage("console takes no arguments, got %q", f.Args())
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	if *interval <= 0 || *deadLetters < 1 {
		return service.Usage("-interval must be positive and -dead-letters at least 1")
	}
	sec := security()
	if err := sec.Validate(); err != nil {
		return service.Usage("%v", err)
	}
	tokens, err := sec.Tokens()
	if err != nil {
		return err
	}
	if err := sec.CheckListen(*addr, tokens); err != nil {
		return service.Usage("console: %v", err)
	}
	tlsConfig, err := sec.TLS().Config()
	if err != nil {
		return err
	}
	// The console's own calls (the services' metrics, the rebuilds'
	// status, the re-emissions) carry the operator's token.
	token, err := auth.TokenFromEnv()
	if err != nil {
		return err
	}
	a := apiAccess{ClientSettings: auth.ClientSettings{CAFile: *ca, InsecurePlainHTTP: sec.InsecurePlainHTTP}, token: token}
	hc, err := a.httpClient(5 * time.Second)
	if err != nil {
		return err
	}
	wc, err := a.writer(*writerURL)
	if err != nil {
		return err
	}
	log := config.NewLogger(out, *logLevel).With("component", "console")

	pool, err := pgxpool.New(ctx, *pg)
	if err != nil {
		return fmt.Errorf("console: postgres: %w", err)
	}
	defer pool.Close()
	nc, js, err := connectJetStream(*natsURL, "converge-console", natsAuth, nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer nc.Close()
	reg := telemetry.NewRegistry()
	c, err := console.New(console.Config{
		DB: pool, JS: js, Slot: *slot,
		Writer: *writerMetrics, Relay: *relayMetrics,
		Projectors: []console.Service{{Name: "index", Addr: *indexAddr}, {Name: "graph", Addr: *graphAddr}},
		Verify:     *verifyAddr,
		HTTP:       hc, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP,
		Reemitter: writerReemitter{wc},
		Tokens:    tokens, Registry: reg,
		Interval: *interval, DeadLetterLimit: *deadLetters,
		Log: log,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.Handler(reg))
	mux.Handle("/", c.Handler())
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	log.Info("serving the console", "url", scheme+"://"+*addr+"/", "authentication", tokens.Enabled(), "interval", interval.String())
	g, ctx := errgroup.WithContext(ctx)
	if tokens.Enabled() {
		g.Go(func() error { tokens.Watch(ctx, log.With("component", "auth")); return nil })
	}
	g.Go(func() error { return c.Run(ctx) })
	g.Go(func() error {
		err := telemetry.Serve(ctx, *addr, mux, 5*time.Second, nil, telemetry.WithTLS(tlsConfig))
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("console: serve %s: %w", *addr, err)
		}
		return ctx.Err()
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
