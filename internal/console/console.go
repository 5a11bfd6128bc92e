package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/deadletter"
)

// Defaults of [Config].
const (
	DefaultInterval        = time.Second
	DefaultDeadLetterLimit = 50
)

// Service is a converge service whose metrics address the console reads:
// its /metrics for the rates, and for a projector its rebuild status.
type Service struct {
	// Name is the service's role: "writer", "relay", or a projector's
	// store ("index", "graph"), which names its stage in the picture.
	Name string `json:"name"`
	// Addr is host:port (plain HTTP) or an http:// or https:// URL.
	Addr string `json:"addr"`
}

// Config of a [Console].
type Config struct {
	// DB reads the relay's slot, the outbox and the inbox (the read-only
	// role of converge status is enough).
	DB *pgxpool.Pool
	// JS reads the streams, their consumers, the dead letters and the
	// rebuilds' bucket, and redrives dead letters: the operator's NATS
	// user, as converge status and converge dlq connect.
	JS jetstream.JetStream
	// Slot is the relay's replication slot.
	Slot string
	// Writer and Relay are the metrics addresses of the writer and the
	// relay; Projectors those of the projectors (their /metrics and
	// rebuild status), by store. An empty address is not read.
	Writer, Relay string
	Projectors    []Service
	// Verify is the address of converge verify -watch's status
	// (-metrics-addr); empty: no agreement is shown.
	Verify string
	// HTTP reads the services (its transport trusts their CAs); Token is
	// sent to them, InsecurePlainHTTP lets it go over plain HTTP beyond
	// loopback.
	HTTP              *http.Client
	Token             string
	InsecurePlainHTTP bool
	// Reemitter re-emits the documents of CONVERGE_DOCS's dead letters
	// (the writer's API); nil: those are kept, and say so.
	Reemitter deadletter.Reemitter
	// Tokens are the tokens the console's API accepts (nil:
	// authentication off); refusals are counted on Registry.
	Tokens   *auth.Tokens
	Registry prometheus.Registerer
	// Interval is how often the pipeline is read; DeadLetterLimit how
	// many dead letters of each consumer are shown, oldest first.
	Interval        time.Duration
	DeadLetterLimit int
	Log             *slog.Logger
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.DB == nil:
		return errors.New("console: no Postgres")
	case c.JS == nil:
		return errors.New("console: no NATS")
	case c.Interval < 0 || c.DeadLetterLimit < 0:
		return fmt.Errorf("console: interval %v and dead-letter limit %d must not be negative", c.Interval, c.DeadLetterLimit)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.DeadLetterLimit == 0 {
		c.DeadLetterLimit = DefaultDeadLetterLimit
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 5 * time.Second}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Console reads the pipeline every interval and serves the page and its
// API ([Console.Handler]).
type Console struct {
	cfg   Config
	guard *auth.Guard
	kick  chan struct{}

	mu      sync.Mutex
	last    *Reading
	rates   rates
	redrive sync.Mutex // one redrive at a time
}

// New returns a console; [Console.Run] reads the pipeline.
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Console{
		cfg:   cfg,
		guard: auth.NewGuard(cfg.Tokens, cfg.Registry, cfg.Log),
		kick:  make(chan struct{}, 1),
		rates: rates{},
	}, nil
}

// Run reads the pipeline every interval, and at once after a redrive,
// until ctx ends.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		r := c.read(ctx)
		c.mu.Lock()
		c.last = &r
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.kick:
		}
	}
}

// Last is the last reading; [ErrNoReading] before the first.
func (c *Console) Last() (Reading, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return Reading{}, ErrNoReading
	}
	return *c.last, nil
}

// readAgain asks Run for a reading now.
func (c *Console) readAgain() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}
