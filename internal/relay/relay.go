package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// Relay is the outbox-to-JetStream relay.
type Relay struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	metrics *Metrics
	log     *slog.Logger

	active    atomic.Bool
	confirmed atomic.Uint64
	// failing is the first of the publishing failures since the last
	// event JetStream stored (nil: none).
	failing atomic.Pointer[publishFailure]

	// ensured: the streams were ensured by a session of this process;
	// noStreamSince is when sessions began to find no stream listening,
	// after which ensureAgain they ensure the streams again. positions is
	// the bucket of recorded positions, opened once.
	ensured, everEnsured bool
	noStreamSince        time.Time
	positions            *Positions
	// effectsStreams and effectsPrefixes are the effects' partitions'
	// streams and subject prefixes, read with cfg.Effects.Partitions when
	// the streams are ensured.
	effectsStreams, effectsPrefixes []string
	// effectsKnown is cfg.Effects.Partitions once the session read it
	// (-1 before), for the watch of a running session.
	effectsKnown atomic.Int64
}

// ensureAgain is how long sessions may find no stream before they create
// it again (a stream deleted meanwhile, or a cluster that lost it).
const ensureAgain = 10 * time.Second

// New returns a relay publishing over nc.
func New(nc *nats.Conn, cfg Config, metrics *Metrics, log *slog.Logger) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	// Used to manage the stream; publishes go through the session's
	// publisher.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("relay: jetstream: %w", err)
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{cfg: cfg, nc: nc, js: js, metrics: metrics, log: log}, nil
}

// Active reports whether this relay currently holds the slot.
func (r *Relay) Active() bool { return r.active.Load() }

// ConfirmedLSN is the position last confirmed to Postgres.
func (r *Relay) ConfirmedLSN() pglogrepl.LSN { return pglogrepl.LSN(r.confirmed.Load()) }

// Run relays until ctx ends. Errors of a session (Postgres restarts, NATS
// outages) end that session and start another from the confirmed position;
// only configuration problems end Run.
func (r *Relay) Run(ctx context.Context) error {
	if max := r.nc.MaxPayload(); max < contract.MaxMessageBytes {
		return fmt.Errorf("relay: the NATS server's max_payload is %d bytes; converge needs %d (the largest event and its headers): set max_payload: 8MB in the server configuration", max, contract.MaxMessageBytes)
	}
	mon := &monitor{cfg: r.cfg, metrics: r.metrics, log: r.log}
	monCtx, stopMon := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(monCtx) }()
	defer func() { stopMon(); <-monDone }()

	standbyLogged := false
	for {
		wait := r.cfg.StandbyRetry
		err := r.session(ctx)
		r.noteStreams(err)
		r.active.Store(false)
		r.metrics.Active.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		var elsewhere *slotElsewhereError
		switch {
		case errors.As(err, &elsewhere):
			return err
		case errors.Is(err, errEffectsMoved):
			wait = 0
		case errors.Is(err, errSlotActive):
			if !standbyLogged {
				r.log.Info("slot held by another relay; waiting as a standby", "slot", r.cfg.Slot)
				standbyLogged = true
			}
		case err != nil:
			standbyLogged = false
			cause := "postgres"
			var pe *publishError
			if errors.As(err, &pe) {
				cause = "publish"
				r.notePublishFailure(pe.err)
			}
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, errLostBefore) {
				// No stream leader, or a publish one lost: a cluster
				// electing a leader, which answers again within seconds.
				// Start again soon, not after StandbyRetry.
				wait = min(wait, publishRetry)
			}
			r.metrics.SessionErrors.WithLabelValues(cause).Inc()
			r.log.Error("replication session ended; resuming from the confirmed position", "err", err,
				"confirmed_lsn", r.ConfirmedLSN().String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// noteStreams decides, from how a session ended, whether the next one
// ensures the streams again: yes after a publishing failure (a refusal:
// an operator changed a limit, which the next ensure reports by name
// without changing it back; a lost acknowledgement; a failed
// catch-up, a stream gone meanwhile), and after finding no stream
// listening for ensureAgain; not while it is shorter (a leader being
// elected, whose stream API answers nothing for seconds), nor after a
// lost connection, a lost publish or a refusal out of order (the stream
// answered), nor when Postgres was the cause or another relay holds the
// slot. A session that found the effects' partitions changed has the
// next one ensure them.
func (r *Relay) noteStreams(err error) {
	var pe *publishError
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		if r.noStreamSince.IsZero() {
			r.noStreamSince = time.Now()
		}
		r.ensured = time.Since(r.noStreamSince) < ensureAgain
	case errors.Is(err, errEffectsMoved):
		// The effects' partitions changed: their streams are ensured
		// with their new number.
		r.ensured = false
	case errors.Is(err, errReconnected), errors.Is(err, errLostBefore), errors.As(err, new(*wrongLastError)):
		r.noStreamSince = time.Time{}
	case errors.As(err, &pe):
		r.ensured, r.noStreamSince = false, time.Time{}
	}
}

// publishRetry is how soon a session that found no stream leader, or a
// publish lost, is followed by the next (at most StandbyRetry).
const publishRetry = 200 * time.Millisecond
