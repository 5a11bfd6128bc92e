// Package telemetry serves each converge service's operational endpoints:
// /metrics (Prometheus), /healthz (the process is alive) and /readyz (its
// dependencies answer, checked on each request). [Scrape] reads a /metrics
// endpoint back, for the CLI, tests and benchmarks, with Prometheus's own
// text parser rather than by hand. [Serve] and [ServeListener] run every
// HTTP listener of the services, over TLS when given a key pair
// ([TLSFiles]).
package telemetry

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/converge-sync/converge/internal/version"
)

// Check is one readiness dependency; it returns nil when ready.
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// NewRegistry returns a registry with the Go runtime and process collectors
// and converge_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	return reg
}

// Handler returns the mux of /metrics, /healthz and /readyz.
func Handler(reg *prometheus.Registry, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		status, failures := http.StatusOK, map[string]string{}
		for _, c := range checks {
			if err := c.Func(ctx); err != nil {
				status, failures[c.Name] = http.StatusServiceUnavailable, err.Error()
			}
		}
		body := map[string]any{"status": "ready"}
		if status != http.StatusOK {
			body = map[string]any{"status": "not_ready", "failures": failures}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	})
	return mux
}

// ServeOption is an option of [Serve] and [ServeListener].
type ServeOption func(*serveOptions)

type serveOptions struct {
	tls *tls.Config
}

// WithTLS serves HTTPS with cfg (see [TLSFiles.Config]); nil is plain
// HTTP.
func WithTLS(cfg *tls.Config) ServeOption {
	return func(o *serveOptions) { o.tls = cfg }
}

// Serve runs an HTTP server for h on addr until ctx ends, then shuts it
// down gracefully, letting in-flight requests finish within grace.
func Serve(ctx context.Context, addr string, h http.Handler, grace time.Duration, log *slog.Logger, opts ...ServeOption) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return ServeListener(ctx, ln, h, grace, log, opts...)
}

// ServeListener is Serve on an existing listener.
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration, log *slog.Logger, opts ...ServeOption) error {
	var o serveOptions
	for _, opt := range opts {
		opt(&o)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	if o.tls != nil {
		// ServeTLS adds HTTP/2 to the protocols offered, as Serve does
		// for plain HTTP.
		srv.TLSConfig = o.tls.Clone()
		go func() { errc <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { errc <- srv.Serve(ln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if log != nil {
		log.Info("shutting down http server", "addr", ln.Addr().String())
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
