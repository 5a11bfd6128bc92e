package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// defaultVerifyMetricsAddr is where converge verify -watch serves
// /metrics, /healthz, /readyz and /v1/verify/status.
const defaultVerifyMetricsAddr = "127.0.0.1:9106"

// watchSettings are the flags of converge verify -watch.
type watchSettings struct {
	on          *bool
	pass, wait  *time.Duration
	step        *int
	metricsAddr *string
	natsURL     *string
	slot        *string
	consumers   map[string]*string
	natsAuth    func() (natsauth.ClientConfig, error)
	logLevel    *string
}

// bindWatch binds the flags of converge verify -watch.
func bindWatch(f *config.Flags) watchSettings {
	return watchSettings{
		on: f.Bool("watch", "", false, "verify continuously until interrupted: walk the buckets -watch-step at a time, "+
			"a full walk every -watch-pass, each store compared once its projection passed the position Postgres was read at; "+
			"serve metrics and /v1/verify/status on -metrics-addr; with --repair, re-emit each difference named"),
		pass: f.Duration("watch-pass", "CONVERGE_VERIFY_PASS", verify.DefaultWatchPass,
			"with -watch: how long a walk over every bucket takes (the rate: a step every pass*step/buckets)"),
		step: f.Int("watch-step", "CONVERGE_VERIFY_STEP", verify.DefaultWatchStep, "with -watch: buckets read at each step"),
		wait: f.Duration("watch-wait", "CONVERGE_VERIFY_WAIT", verify.DefaultWatchWait,
			"with -watch: how long a step waits for a projection to pass the position Postgres was read at before it leaves its buckets unproven"),
		metricsAddr: f.String("metrics-addr", "CONVERGE_VERIFY_METRICS_ADDR", defaultVerifyMetricsAddr,
			"with -watch: address of /metrics, /healthz, /readyz and /v1/verify/status (loopback only)"),
		natsURL: f.String("nats-url", config.EnvNATSURL, "", "with -watch: NATS URL, where the projectors' progress is read"),
		slot:    f.String("slot", "CONVERGE_RELAY_SLOT", relay.DefaultSlot, "with -watch: the relay's replication slot"),
		consumers: map[string]*string{
			"index": f.String("index-consumer", "", "index", "with -watch: the index projector's durable consumer (its -name)"),
			"graph": f.String("graph-consumer", "", "graph", "with -watch: the graph projector's durable consumer (its -name)"),
		},
		natsAuth: natsauth.Flags(f),
		logLevel: f.String("log-level", config.EnvLogLevel, "info", "with -watch: debug, info, warn or error"),
	}
}

// validate checks the watch's flags before anything is reached.
func (s watchSettings) validate(buckets int) error {
	if *s.pass <= 0 || *s.step < 1 || *s.step > buckets || *s.wait <= 0 {
		return service.Usage("-watch-pass and -watch-wait must be positive, -watch-step from 1 to -buckets (%d)", buckets)
	}
	if err := config.Require(*s.natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	if *s.metricsAddr != "" && !auth.Loopback(*s.metricsAddr) {
		return service.Usage("-metrics-addr %s: the status names documents' keys; serve it on loopback (127.0.0.1)", *s.metricsAddr)
	}
	return nil
}

// runWatch is converge verify -watch: it runs until ctx ends, logging to
// out (JSON lines: each difference named, gone, re-emitted, repaired).
func runWatch(ctx context.Context, s watchSettings, truth *postgres.Postgres, stores []verify.Projection, buckets int, repairer verify.Reemitter, out io.Writer) error {
	log := config.NewLogger(out, *s.logLevel).With("component", "verify")
	nc, js, err := connectJetStream(*s.natsURL, "converge-verify", s.natsAuth)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer nc.Close()
	consumers := map[string]string{}
	for store, name := range s.consumers {
		consumers[store] = *name
	}
	progress := &verify.Pipeline{DB: truth.Pool, Slot: *s.slot, Stream: contract.DocsStream, JS: js, Consumers: consumers}
	reg := telemetry.NewRegistry()
	w, err := verify.NewWatcher(truth, stores, progress, verify.WatchConfig{Buckets: buckets, Pass: *s.pass, Step: *s.step, Wait: *s.wait,
		Reemitter: repairer, Metrics: verify.NewWatchMetrics(reg), Log: log})
	if err != nil {
		return err
	}
	cfg := w.Status()
	log.Info("verifying continuously", "stores", len(stores), "buckets", cfg.Buckets, "step", cfg.Step, "pass", cfg.Pass,
		"interval", (*s.pass * time.Duration(cfg.Step) / time.Duration(cfg.Buckets)).String(), "repair", repairer != nil, "metrics", *s.metricsAddr)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	if *s.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/", telemetry.Handler(reg))
		mux.Handle("GET /v1/verify/status", w.StatusHandler())
		go func() {
			served <- telemetry.Serve(ctx, *s.metricsAddr, mux, 5*time.Second, log)
			cancel()
		}()
	} else {
		served <- nil
	}
	err = w.Run(ctx)
	cancel()
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("verify: serve %s: %w", *s.metricsAddr, serr)
	}
	return err
}
