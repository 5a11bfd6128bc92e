// Command projector-index is the single writer of the index: it converges
// a Qdrant collection (or the embedded index) to the events of the
// CONVERGE_DOCS stream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/backends"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/telemetry"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "projector-index:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	f := config.NewFlags("projector-index")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, "127.0.0.1:9103", "address of /metrics, /healthz, /readyz and /v1/search (empty: off)")
	name := f.String("name", "CONVERGE_PROJECTOR_NAME", "index", "durable consumer name; dead letters go to converge.dlq.<name>")
	batch := f.Int("batch", "CONVERGE_PROJECTOR_BATCH", 256, "messages fetched and applied at once")
	parallel := f.Int("parallel", "CONVERGE_PROJECTOR_PARALLEL", 2, "shards of a batch applied at once")
	maxDeliver := f.Int("max-deliver", "CONVERGE_PROJECTOR_MAX_DELIVER", 5, "deliveries after which an event the store rejects is dead-lettered")
	reuse := f.Bool("reuse-vectors", "CONVERGE_INDEX_REUSE_VECTORS", false, "reuse the stored vectors of unchanged chunks (worth it with a remote embedder)")
	level := f.String("log-level", config.EnvLogLevel, "info", "debug, info, warn or error")
	store := backends.Flags(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	cfg := store()
	log := config.NewLogger(os.Stderr, *level)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(*natsURL, nats.Name("converge-projector-index"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	backend, embedder, err := backends.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = backend.Close() }()
	x, err := index.New(ctx, backend, embedder, index.Options{ReuseVectors: *reuse})
	if err != nil {
		return err
	}
	log.Info("index store", "store", cfg.Describe(), "embedder", embedder.Name(), "dimension", embedder.Dimension())

	reg := telemetry.NewRegistry()
	r, err := projector.New(js, x, projector.Config{Name: *name, BatchSize: *batch, Parallel: *parallel, MaxDeliver: *maxDeliver},
		projector.NewMetrics(reg, *name), log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) })
	if *metricsAddr != "" {
		checks := []telemetry.Check{
			{Name: "nats", Func: func(context.Context) error {
				if !nc.IsConnected() {
					return fmt.Errorf("nats: %s", nc.Status())
				}
				return nil
			}},
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
		mux.Handle("/", telemetry.Handler(reg, checks...))
		mux.Handle("GET /v1/search", index.SearchHandler(x))
		g.Go(func() error {
			return telemetry.Serve(ctx, *metricsAddr, mux, 5*time.Second, nil)
		})
	}
	return g.Wait()
}
