package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// ServiceConfig is the relay service's configuration: the relay's own
// settings, NATS, and what the process serves.
type ServiceConfig struct {
	Relay       Config
	NATSURL     string
	MetricsAddr string // /metrics, /healthz and /readyz; empty: off
	// GOGC and MemoryLimit tune the process's collector (see [TuneGC]);
	// 0 leaves the runtime's settings alone, as `converge dev` does, where
	// the relay shares its process with the other services.
	GOGC        int
	MemoryLimit int64
	// NATSAuth authenticates the relay to NATS (its own user).
	NATSAuth natsauth.ClientConfig
	// TLS of the metrics address; zero: plain HTTP.
	TLS telemetry.TLSFiles
	// OnStart, when set, is called with the relay once it is made, before
	// it runs: a caller in the same process can watch [Relay.Active].
	OnStart func(*Relay)
}

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	if c.NATSURL == "" {
		return errors.New("relay: a NATS URL is required")
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return c.Relay.Validate()
}

// Connections are NATS, and a Postgres pool for the readiness check (the
// replication connection is the relay's own, from Relay.PostgresURL).
func (c ServiceConfig) Connections() service.Conns {
	return service.Conns{Client: "converge-relay", NATSURL: c.NATSURL, PostgresURL: c.Relay.PostgresURL, PostgresMaxConns: 2,
		NATSAuth: c.NATSAuth, NATSUnbuffered: true}
}

// DefaultMetricsAddr is the relay's default -metrics-addr.
const DefaultMetricsAddr = "127.0.0.1:9102"

// Flags binds the relay's settings to flags and their environment
// variables; call the returned function after parsing.
func Flags(f *config.Flags) func() (ServiceConfig, error) {
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL (a replication connection is derived from it)")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	metricsAddr := f.String("metrics-addr", config.EnvMetricsAddr, DefaultMetricsAddr, "address of /metrics, /healthz and /readyz (empty: off)")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", DefaultSlot, "logical replication slot")
	window := f.Int("window", "CONVERGE_RELAY_WINDOW", DefaultWindow, "publishes awaiting acknowledgement at most")
	windowBytes := f.Int("window-bytes", "CONVERGE_RELAY_WINDOW_BYTES", DefaultWindowBytes, "payload bytes awaiting acknowledgement at most")
	ackTimeout := f.Duration("ack-timeout", "CONVERGE_RELAY_ACK_TIMEOUT", DefaultAckTimeout, "how long a publish may await its acknowledgement before the session resumes from the confirmed position (a message lost in a stream leader change on a cluster is never answered)")
	heartbeat := f.Duration("heartbeat", "CONVERGE_RELAY_HEARTBEAT", DefaultHeartbeatInterval, "interval of the logical heartbeat that advances an idle slot (negative: off)")
	standby := f.Duration("standby-retry", "CONVERGE_RELAY_STANDBY_RETRY", DefaultStandbyRetry, "how often a standby retries the slot, and the delay before reconnecting after an error")
	lagAlarm := f.Int("lag-alarm-bytes", "CONVERGE_RELAY_LAG_ALARM_BYTES", DefaultLagAlarmBytes, "log an alarm while the slot's lag exceeds this")
	streams := StreamFlags(f)
	gogc := f.Int("gogc", "CONVERGE_RELAY_GOGC", 300, "garbage collector target percentage (GOGC); the memory limit below bounds the heap")
	memLimit := f.Int("memory-limit-mib", "CONVERGE_RELAY_MEMORY_LIMIT_MIB", 48, "soft heap limit in MiB (GOMEMLIMIT)")
	natsAuth := natsauth.Flags(f)
	tlsFiles := auth.BindTLSFlags(f)
	return func() (ServiceConfig, error) {
		for _, req := range [][3]string{{*pg, "postgres-url", config.EnvPostgresURL}, {*natsURL, "nats-url", config.EnvNATSURL}} {
			if err := config.Require(req[0], req[1], req[2]); err != nil {
				return ServiceConfig{}, err
			}
		}
		c := ServiceConfig{NATSURL: *natsURL, MetricsAddr: *metricsAddr, GOGC: *gogc, MemoryLimit: int64(*memLimit) << 20,
			TLS: tlsFiles()}
		var err error
		if c.NATSAuth, err = natsAuth(); err != nil {
			return ServiceConfig{}, err
		}
		if c.Relay, err = streams(); err != nil {
			return ServiceConfig{}, err
		}
		r := &c.Relay
		r.PostgresURL, r.Slot, r.Window, r.WindowBytes, r.AckTimeout = *pg, *slot, *window, *windowBytes, *ackTimeout
		r.HeartbeatInterval, r.StandbyRetry, r.LagAlarmBytes = *heartbeat, *standby, int64(*lagAlarm)
		return c, nil
	}
}

// StreamFlags binds the settings of the relay's streams (Config.Stream and
// Config.Effects) to flags and their environment variables: the relay's,
// and those of `converge streams apply`, which sets the streams to them.
func StreamFlags(f *config.Flags) func() (Config, error) {
	storage := f.String("stream-storage", "CONVERGE_STREAM_STORAGE", "file", "stream storage: file or memory")
	replicas := f.Replicas()
	dupes := f.Duration("stream-duplicates", "CONVERGE_STREAM_DUPLICATE_WINDOW", DefaultStreamDuplicates, "duplicate window; must exceed the longest relay outage plus catch-up")
	perSubject := f.Int("stream-history", "CONVERGE_STREAM_HISTORY", DefaultStreamMaxMsgsPerSubject, "events kept per document (-1: all)")
	effects := f.Bool("effects", "CONVERGE_RELAY_EFFECTS", false, "publish every event to the effects' stream "+contract.EventsStream+" too, which keeps each until the notifier handled it: on wherever a notifier runs")
	effectsAge := f.Duration("effects-max-age", "CONVERGE_RELAY_EFFECTS_MAX_AGE", DefaultEffectsMaxAge, "age at which an event the notifier has not handled leaves the effects' stream (the notifier's window)")
	effectsBytes := f.Int("effects-max-bytes", "CONVERGE_RELAY_EFFECTS_MAX_BYTES", DefaultEffectsMaxBytes, "size bound of the effects' stream, the oldest events leaving first (-1: unlimited)")
	return func() (Config, error) {
		var c Config
		switch *storage {
		case "file":
			c.Stream.Storage = jetstream.FileStorage
		case "memory":
			c.Stream.Storage = jetstream.MemoryStorage
		default:
			return Config{}, fmt.Errorf("-stream-storage must be file or memory, got %q", *storage)
		}
		c.Stream.Replicas, c.Stream.Duplicates, c.Stream.MaxMsgsPerSubject = *replicas, *dupes, int64(*perSubject)
		c.Effects.Enabled, c.Effects.MaxAge, c.Effects.MaxBytes = *effects, *effectsAge, int64(*effectsBytes)
		return c, nil
	}
}

// Run runs a relay over deps.NATS until ctx ends (see [Relay.Run]),
// serving /metrics, /healthz and /readyz on cfg.MetricsAddr.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if deps.NATS == nil {
		return errors.New("relay: no NATS connection")
	}
	deps = deps.WithDefaults()
	tlsConfig, err := cfg.TLS.Config()
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	TuneGC(cfg.GOGC, cfg.MemoryLimit)
	if cfg.Relay.Clock == nil {
		cfg.Relay.Clock = deps.Clock
	}
	r, err := New(deps.NATS, cfg.Relay, NewMetrics(deps.Registry), deps.Log)
	if err != nil {
		return err
	}
	if cfg.OnStart != nil {
		cfg.OnStart(r)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) })
	if cfg.MetricsAddr != "" {
		checks := []telemetry.Check{service.NATSCheck(deps.NATS), {Name: "publishing", Func: r.Publishing}}
		if deps.Postgres != nil {
			checks = append(checks, telemetry.Check{Name: "postgres", Func: deps.Postgres.Ping})
		}
		g.Go(func() error {
			return telemetry.Serve(ctx, cfg.MetricsAddr, telemetry.Handler(deps.Registry, checks...), 5*time.Second, nil, telemetry.WithTLS(tlsConfig))
		})
	}
	return g.Wait()
}
