// Package service is the one shape of every converge service. Each of the
// writer, the relay, the two projectors and the notifier has, in its own
// package, a configuration with defaults and Validate, a Flags function
// that binds it to flags and environment variables, and
//
//	Run(ctx context.Context, cfg Config, deps service.Deps) error
//
// which runs the service until ctx ends. Deps carries what Run uses but does
// not own: the logger, the metrics registry, the connections to NATS and
// Postgres, and the wall clock. [Main] is a service's whole command (cmd/<service>/main.go is
// one call of it); [Command] is the same inside another command (`converge
// projector-index`); [Run] dials a configuration's connections and runs it,
// which is how `converge dev`, the demo, the end-to-end tests and the
// benchmarks start the very same services.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/telemetry"
)

// Deps are a running service's dependencies, made by its caller.
type Deps struct {
	Log *slog.Logger
	// Registry is where the service registers its metrics; it serves them
	// on its metrics address.
	Registry *prometheus.Registry
	// NATS is the connection to NATS, nil for a service that has none
	// (the writer without ingest).
	NATS *nats.Conn
	// Postgres is a pool of connections to Postgres, nil for a service
	// that holds no Postgres credentials (the projectors, the notifier).
	Postgres *pgxpool.Pool
	// Clock is the wall clock of the times the service writes for other
	// processes and compares with theirs: clock.Wall(), which honours the
	// fault hook clock.EnvFaultFile.
	Clock clock.Clock
}

// WithDefaults fills what a caller left nil: a registry of its own and a
// logger that discards, so that a service run with hand-made Deps does not
// fail on a nil pointer.
func (d Deps) WithDefaults() Deps {
	if d.Registry == nil {
		d.Registry = telemetry.NewRegistry()
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = clock.Wall()
	}
	return d
}

// JetStream is the JetStream context of d.NATS.
func (d Deps) JetStream() (jetstream.JetStream, error) {
	if d.NATS == nil {
		return nil, errors.New("service: no NATS connection")
	}
	return jetstream.New(d.NATS)
}

// Conns names the connections a configuration needs; an empty URL is a
// connection not made.
type Conns struct {
	// Client names the service to the servers: the NATS connection's name
	// (the server's monitoring shows it) and Postgres' application_name.
	Client      string
	NATSURL     string
	PostgresURL string
	// PostgresMaxConns bounds the pool; 0: pgx's default.
	PostgresMaxConns int
	// NATSAuth is how the service authenticates to NATS (its own user)
	// and trusts the server's TLS certificate.
	NATSAuth natsauth.ClientConfig
	// NATSUnbuffered makes a publish fail while the connection is being
	// re-established, instead of buffering it for the new server: the
	// relay's, which publishes in commit order and must not have a newer
	// message stored before an older one the old connection lost.
	NATSUnbuffered bool
}

// Config is what every service's configuration provides besides its own
// settings.
type Config interface {
	// Validate reports a configuration that cannot work, naming the
	// setting; defaults are applied before it is called.
	Validate() error
	// Connections names the connections the service needs.
	Connections() Conns
}

// Dial opens c's connections: NATS reconnecting for as long as the
// service runs, and a Postgres pool. close drains NATS (so that the last
// acknowledgements reach the server) and closes the pool.
func Dial(ctx context.Context, c Conns, log *slog.Logger) (Deps, func(), error) {
	d := Deps{Log: log, Registry: telemetry.NewRegistry(), Clock: clock.Wall()}
	closeAll := func() {
		if d.NATS != nil {
			drain(d.NATS, log)
		}
		if d.Postgres != nil {
			d.Postgres.Close()
		}
	}
	fail := func(err error) (Deps, func(), error) {
		// Nothing ran on these connections: close them at once, no drain.
		if d.NATS != nil {
			d.NATS.Close()
		}
		if d.Postgres != nil {
			d.Postgres.Close()
		}
		return Deps{}, nil, err
	}
	if c.NATSURL != "" {
		opts, err := c.NATSAuth.Options()
		if err != nil {
			return fail(fmt.Errorf("nats credentials: %w", err))
		}
		// A permission the server refuses is logged and counted
		// (converge_nats_permission_violations_total): it is the
		// service's configuration, not a transient failure.
		opts = append(opts, nats.Name(c.Client), nats.MaxReconnects(-1),
			nats.ErrorHandler(natsauth.ErrorHandler(log, natsauth.DeniedCounter(d.Registry))))
		if c.NATSUnbuffered {
			opts = append(opts, nats.ReconnectBufSize(-1))
		}
		nc, err := nats.Connect(c.NATSURL, opts...)
		if err != nil {
			return fail(fmt.Errorf("connect nats: %w", err))
		}
		d.NATS = nc
	}
	if c.PostgresURL != "" {
		pc, err := pgxpool.ParseConfig(c.PostgresURL)
		if err != nil {
			return fail(fmt.Errorf("postgres url: %w", err))
		}
		if c.PostgresMaxConns > 0 {
			pc.MaxConns = int32(min(c.PostgresMaxConns, 1<<16)) //nolint:gosec // bounded above
		}
		if _, set := pc.ConnConfig.RuntimeParams["application_name"]; !set && c.Client != "" {
			pc.ConnConfig.RuntimeParams["application_name"] = c.Client
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return fail(fmt.Errorf("connect postgres: %w", err))
		}
		d.Postgres = pool
	}
	return d, closeAll, nil
}

// drain lets the last acknowledgements reach the server before the
// connection closes, waiting a bounded time for it.
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

// Run validates cfg, dials its connections, and runs run with them until
// ctx ends; a service stopped while it was starting is not a failure.
func Run[C Config](ctx context.Context, cfg C, log *slog.Logger, run func(context.Context, C, Deps) error) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	deps, closeDeps, err := Dial(ctx, cfg.Connections(), log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer closeDeps()
	err = run(ctx, cfg, deps)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped, possibly while starting: the stop itself is no
		// failure. Anything else that failed on the way out (requests
		// cut off when the grace ran out, a store that could not flush)
		// is, and is returned.
		return nil
	}
	return err
}

// Command is a service's command line inside a larger command: the
// service's flags (bind returns the function that makes its configuration
// after parsing) and -log-level, then [Run] until ctx ends. Its log goes
// to stderr.
func Command[C Config](ctx context.Context, name string, args []string, bind func(*config.Flags) func() (C, error), run func(context.Context, C, Deps) error) error {
	return command(ctx, name, args, os.Stderr, bind, run)
}

// Bind binds the command line of service name, as its binary has it:
// bind's flags and -log-level, reading variables from environ (nil: the
// process's). Parse the flags, then call get for the configuration.
func Bind[C Config](name string, environ config.Environ, bind func(*config.Flags) func() (C, error)) (f *config.Flags, get func() (C, error), level *string) {
	if environ == nil {
		environ = os.LookupEnv
	}
	f = config.NewFlagsIn(name, environ)
	level = f.String("log-level", config.EnvLogLevel, "info", "debug, info, warn or error")
	return f, bind(f), level
}

// Parse is the configuration of service name for args, read as its
// binary reads it (see [Bind]: its flags, its variables from environ, and
// the configuration file), validated. Errors are [UsageError]s, or
// flag.ErrHelp.
func Parse[C Config](name string, environ config.Environ, args []string, bind func(*config.Flags) func() (C, error)) (C, *string, error) {
	var zero C
	f, get, level := Bind(name, environ, bind)
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return zero, nil, err
		}
		return zero, nil, &UsageError{Err: err}
	}
	cfg, err := get()
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return zero, nil, &UsageError{Err: err}
	}
	return cfg, level, nil
}

func command[C Config](ctx context.Context, name string, args []string, logOut io.Writer, bind func(*config.Flags) func() (C, error), run func(context.Context, C, Deps) error) error {
	cfg, level, err := Parse(name, nil, args, bind)
	if err != nil {
		return err
	}
	log := config.NewLogger(logOut, *level)
	// Traces are exported over OTLP when the environment names an
	// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT); otherwise none is made.
	stopTracing, err := telemetry.StartTracing(ctx, "converge-"+name, log)
	if err != nil {
		return &UsageError{Err: err}
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flush); err != nil {
			log.Warn("the last spans were not exported", "err", err)
		}
	}()
	return Run(ctx, cfg, log, run)
}

// Main is a service's whole command: [Command] over os.Args until SIGINT
// or SIGTERM, then exit: 0 when it stopped cleanly or showed its help, 2
// for a command line or configuration it cannot run, 1 for a failure.
func Main[C Config](name string, bind func(*config.Flags) func() (C, error), run func(context.Context, C, Deps) error) {
	ctx, stop := SignalContext()
	err := Command(ctx, name, os.Args[1:], bind, run)
	stop()
	Exit(name, err)
}

// SignalContext is the context of a command: canceled on SIGINT or
// SIGTERM, when every service stops.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Exit ends the process after a command returned err, printing it prefixed
// with name: 0 for nil or a request for help, 2 for a usage or
// configuration error (see [Usage]), 1 otherwise.
func Exit(name string, err error) {
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode is Exit's status for err, which it prints to w.
func ExitCode(name string, err error, w io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(w, "%s: %v\n", name, err)
	if IsUsage(err) {
		return 2
	}
	return 1
}

// NATSCheck is the readiness check of a NATS connection: failing while it
// is disconnected.
func NATSCheck(nc *nats.Conn) telemetry.Check {
	return telemetry.Check{Name: "nats", Func: func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats: %s", nc.Status())
		}
		return nil
	}}
}
