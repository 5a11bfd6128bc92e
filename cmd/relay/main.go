// Command relay streams the outbox from Postgres to JetStream: the only
// publisher of the CONVERGE_DOCS stream. Run two for availability: the
// second waits as a standby until the first goes away.
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/telemetry"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	f := config.NewFlags("relay")
	var cfg relay.Config
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL (a replication connection is derived from it)")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, "127.0.0.1:9102", "address of /metrics, /healthz and /readyz (empty: off)")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", "converge_relay", "logical replication slot")
	window := f.Int("window", "CONVERGE_RELAY_WINDOW", 4096, "publishes awaiting acknowledgement at most")
	windowBytes := f.Int("window-bytes", "CONVERGE_RELAY_WINDOW_BYTES", 32<<20, "payload bytes awaiting acknowledgement at most")
	ackTimeout := f.Duration("ack-timeout", "CONVERGE_RELAY_ACK_TIMEOUT", 30*time.Second, "how long a publish may await its acknowledgement before the session resumes from the confirmed position")
	heartbeat := f.Duration("heartbeat", "CONVERGE_RELAY_HEARTBEAT", 10*time.Second, "interval of the logical heartbeat that advances an idle slot (negative: off)")
	standby := f.Duration("standby-retry", "CONVERGE_RELAY_STANDBY_RETRY", 2*time.Second, "how often a standby retries the slot, and the delay before reconnecting after an error")
	lagAlarm := f.Int("lag-alarm-bytes", "CONVERGE_RELAY_LAG_ALARM_BYTES", 1<<30, "log an alarm while the slot's lag exceeds this")
	storage := f.String("stream-storage", "CONVERGE_STREAM_STORAGE", "file", "stream storage: file or memory")
	replicas := f.Int("stream-replicas", "CONVERGE_STREAM_REPLICAS", 1, "stream replicas")
	dupes := f.Duration("stream-duplicates", "CONVERGE_STREAM_DUPLICATE_WINDOW", 10*time.Minute, "duplicate window; must exceed the longest relay outage plus catch-up")
	perSubject := f.Int("stream-history", "CONVERGE_STREAM_HISTORY", 4, "events kept per document (-1: all)")
	gogc := f.Int("gogc", "CONVERGE_RELAY_GOGC", 300, "garbage collector target percentage (GOGC); the memory limit below bounds the heap")
	memLimit := f.Int("memory-limit-mib", "CONVERGE_RELAY_MEMORY_LIMIT_MIB", 48, "soft heap limit in MiB (GOMEMLIMIT)")
	level := f.String("log-level", config.EnvLogLevel, "info", "debug, info, warn or error")
	if err := f.Parse(args); err != nil {
		return err
	}
	for _, req := range [][3]string{{*pg, "postgres-url", config.EnvPostgresURL}, {*natsURL, "nats-url", config.EnvNATSURL}} {
		if err := config.Require(req[0], req[1], req[2]); err != nil {
			return err
		}
	}
	switch *storage {
	case "file":
		cfg.Stream.Storage = jetstream.FileStorage
	case "memory":
		cfg.Stream.Storage = jetstream.MemoryStorage
	default:
		return fmt.Errorf("-stream-storage must be file or memory, got %q", *storage)
	}
	cfg.PostgresURL, cfg.Slot, cfg.Window, cfg.HeartbeatInterval, cfg.LagAlarmBytes = *pg, *slot, *window, *heartbeat, int64(*lagAlarm)
	cfg.StandbyRetry, cfg.WindowBytes, cfg.AckTimeout = *standby, *windowBytes, *ackTimeout
	cfg.Stream.Replicas, cfg.Stream.Duplicates, cfg.Stream.MaxMsgsPerSubject = *replicas, *dupes, int64(*perSubject)
	log := config.NewLogger(os.Stderr, *level)
	relay.TuneGC(*gogc, int64(*memLimit)<<20)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(*natsURL, nats.Name("converge-relay"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect nats: %w", err)
	}
	defer nc.Close()
	pool, err := pgxpool.New(ctx, *pg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()

	reg := telemetry.NewRegistry()
	r, err := relay.New(nc, cfg, relay.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) })
	if *metricsAddr != "" {
		checks := []telemetry.Check{
			{Name: "postgres", Func: pool.Ping},
			{Name: "nats", Func: func(context.Context) error {
				if !nc.IsConnected() {
					return fmt.Errorf("nats: %s", nc.Status())
				}
				return nil
			}},
		}
		g.Go(func() error {
			return telemetry.Serve(ctx, *metricsAddr, telemetry.Handler(reg, checks...), 5*time.Second, nil)
		})
	}
	return g.Wait()
}
