// Command writer is converge's only writer of Postgres: it serves the
// document HTTP API and, when a NATS URL is given, consumes documents from
// converge.ingest.>.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/writer"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	f := config.NewFlags("writer")
	var cfg writer.ServiceConfig
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL; when set, documents are also consumed from converge.ingest.>")
	httpAddr := f.String("http-addr", config.EnvHTTPAddr, "127.0.0.1:8080", "address of the document API")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, "127.0.0.1:9101", "address of /metrics, /healthz and /readyz (empty: off)")
	maxConns := f.Int("max-conns", "CONVERGE_WRITER_MAX_CONNS", 16, "Postgres connections")
	batch := f.Int("batch-size", "CONVERGE_WRITER_BATCH_SIZE", 500, "NDJSON lines per transaction on POST /v1/documents:batch")
	migrate := f.Bool("migrate", "CONVERGE_WRITER_MIGRATE", false, "apply pending schema migrations at start")
	grace := f.Duration("shutdown-grace", "CONVERGE_SHUTDOWN_GRACE", 0, "how long in-flight requests may finish on shutdown (0: 15s)")
	retention := f.Duration("outbox-retention", "CONVERGE_OUTBOX_RETENTION", 24*time.Hour, "delete outbox rows older than this (negative: never); the relay reads WAL, not the table")
	level := f.String("log-level", config.EnvLogLevel, "info", "debug, info, warn or error")
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	cfg.PostgresURL, cfg.NATSURL, cfg.HTTPAddr, cfg.MetricsAddr = *pg, *natsURL, *httpAddr, *metricsAddr
	cfg.MaxConns, cfg.API.BatchSize, cfg.Migrate, cfg.ShutdownGrace = *maxConns, *batch, *migrate, *grace
	cfg.Retention.Retention = *retention

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return writer.RunService(ctx, cfg, config.NewLogger(os.Stderr, *level))
}
