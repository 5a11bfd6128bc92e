package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/converge-sync/converge/internal/telemetry"

	"github.com/converge-sync/converge/pkg/contract"
)

// HeartbeatPrefix is the prefix of the relay's logical heartbeat messages.
const HeartbeatPrefix = "converge.heartbeat"

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
// slot.
func (r *Relay) noteStreams(err error) {
	var pe *publishError
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		if r.noStreamSince.IsZero() {
			r.noStreamSince = time.Now()
		}
		r.ensured = time.Since(r.noStreamSince) < ensureAgain
	case errors.Is(err, errReconnected), errors.Is(err, errLostBefore), errors.As(err, new(*wrongLastError)):
		r.noStreamSince = time.Time{}
	case errors.As(err, &pe):
		r.ensured, r.noStreamSince = false, time.Time{}
	}
}

// publishRetry is how soon a session that found no stream leader, or a
// publish lost, is followed by the next (at most StandbyRetry).
const publishRetry = 200 * time.Millisecond

// errStopped ends a session cancelled while a transaction waited to be
// visible: nothing of it was published, and the session shuts down.
var errStopped = errors.New("relay: stopped")

func (s *session) loop(ctx context.Context) error {
	// A read deadline set once per status interval, instead of a context
	// per message: the hot loop allocates nothing for it. Cancellation
	// moves the deadline to the past to wake a blocked read.
	woken := make(chan struct{})
	stopWake := context.AfterFunc(ctx, func() {
		defer close(woken)
		_ = s.conn.Conn().SetReadDeadline(time.Unix(1, 0))
	})
	// Once only: a second stop reports false ("already stopped") for a wake
	// that never ran, and waiting for it then would never end.
	var stopOnce sync.Once
	s.stopWake = func() {
		stopOnce.Do(func() {
			if !stopWake() {
				<-woken // it ran (or is running): let it finish before the deadline is reset
			}
		})
	}
	defer s.stopWake()
	if err := s.sendStatus(ctx); err != nil {
		return err
	}
	for {
		if ctx.Err() != nil {
			// Finish the transaction being received, so that what was
			// published of it can be confirmed, within the shutdown timeout.
			if !s.inTx || (s.finishing && time.Now().After(s.finishBy)) {
				return s.shutdown()
			}
			if !s.finishing {
				s.finishing, s.finishBy = true, time.Now().Add(s.relay.cfg.ShutdownTimeout)
				s.stopWake()
				if err := s.sendStatus(ctx); err != nil {
					return err
				}
			}
		}
		if !time.Now().Before(s.nextStatus) {
			if err := s.drain(ctx, false); err != nil {
				return err
			}
			if err := s.checkHead(); err != nil {
				return err
			}
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue // a status tick, or cancellation: the loop's top decides
			}
			return fmt.Errorf("relay: receive: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, m.Data); errors.Is(err, errStopped) {
				return s.shutdown()
			} else if err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("relay: replication error: %w", pgconn.ErrorResponseToPgError(m))
		default:
			return fmt.Errorf("relay: unexpected replication message %T", msg)
		}
	}
}

func (s *session) handleCopyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("relay: keepalive: %w", err)
		}
		// Everything the server decoded before ServerWALEnd has been sent;
		// with nothing in flight, it is all acknowledged.
		if s.idle() {
			s.confirm(ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			return s.sendStatus(ctx)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("relay: xlogdata: %w", err)
		}
		return s.handleWAL(ctx, xld)
	}
	return nil
}

func (s *session) idle() bool { return !s.inTx && s.head == len(s.queue) }

func (s *session) handleWAL(ctx context.Context, xld pglogrepl.XLogData) error {
	if d := xld.WALData; len(d) >= 5 && d[0] == 'I' {
		rel, ok := s.relations[binary.BigEndian.Uint32(d[1:5])]
		if !ok {
			return nil // not the outbox
		}
		if s.skipping {
			s.relay.metrics.Skipped.Inc()
			return nil
		}
		if err := rel.decodeInsertFast(d, &s.view); err != nil {
			return err
		}
		return s.publish(ctx, &s.view)
	}
	msg, err := pglogrepl.Parse(xld.WALData)
	if err != nil {
		return fmt.Errorf("relay: decode pgoutput: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		if m.RelationName != "outbox" {
			return nil
		}
		rel, err := newRelation(m)
		if err != nil {
			return err
		}
		s.relations[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		if err := s.awaitVisible(ctx, m.Xid); err != nil {
			return err
		}
		s.inTx = true
		// A commit record that starts before a confirmed position ends at
		// or before it: the transaction was published whole.
		s.skipping = m.FinalLSN < s.skipUntil || s.seen != nil && m.FinalLSN < s.seenEnd && s.seen.complete(m.Xid)
		s.commitTime = m.CommitTime
		// Shared by every message of the transaction; never modified.
		s.commitTimeHdr = []string{m.CommitTime.UTC().Format(time.RFC3339Nano)}
	case *pglogrepl.CommitMessage:
		s.inTx = false
		s.queue = append(s.queue, pending{endLSN: m.TransactionEndLSN})
		return s.drain(ctx, false)
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional && m.Prefix == HeartbeatPrefix && s.idle() {
			s.confirm(m.LSN)
		}
	}
	return nil
}

// tracer is the current provider's: spans are made only with tracing on.
func tracer() trace.Tracer { return telemetry.Tracer("relay") }

func (s *session) publish(ctx context.Context, v *insertView) error {
	n := 1 // publishes of the event
	if s.pub.effects != "" {
		n = 2
	}
	for s.inflight+n > s.relay.cfg.Window || (s.inflight > 0 && s.inflightBytes+n*len(v.payload) > s.relay.cfg.WindowBytes) {
		if err := s.drain(ctx, true); err != nil {
			return err
		}
	}
	// Careful until the documents' stream stored one of the session's
	// events: one event in flight at a time (see publisher.chained).
	for !s.pub.chained && s.inflight > 0 {
		if err := s.drain(ctx, true); err != nil {
			return err
		}
	}
	msgID, reemission := v.messageID()
	subject := subjectOf(v.key)
	var traceParent []string
	if v.trace != nil {
		traceParent = []string{string(v.trace)}
		if telemetry.Tracing() {
			sctx, span := tracer().Start(telemetry.WithTraceParent(ctx, traceParent[0]), "relay publish",
				trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", subject),
					attribute.String("converge.key", string(v.key)), attribute.String("converge.version", string(v.version))))
			// The projectors continue from the relay's span.
			traceParent[0] = telemetry.TraceParent(sctx)
			defer span.End()
		}
	}
	for i := range n {
		effects := i == 1
		if effects {
			subject = eventsSubjectOf(subject)
		}
		// Taken before the publish: its acknowledgement may be handled
		// before publish returns.
		now := time.Now()
		// The payload points into the receive buffer, which the next read
		// reuses: publish copies it into the connection's buffer.
		seq, err := s.pub.publish(subject, msgID, s.commitTimeHdr, reemission, traceParent, v.payload, effects)
		if err != nil {
			return &publishError{err: err}
		}
		s.queue = append(s.queue, pending{pub: true, effects: effects, seq: seq, sent: now, commitTime: s.commitTime,
			size: len(v.payload), reemission: reemission != nil})
		s.inflight++
		s.inflightBytes += len(v.payload)
	}
	return nil
}

// stopBy is the deadline of the whole shutdown, fixed when it begins.
func (s *session) stopBy() time.Time {
	if s.finishBy.IsZero() {
		s.finishBy = time.Now().Add(s.relay.cfg.ShutdownTimeout)
	}
	return s.finishBy
}

// shutdown waits (bounded) for outstanding acknowledgements, confirms what
// they complete, and ends the replication stream with CopyDone. Waiting for
// the server's answer to CopyDone proves it processed the final status
// update: closing the socket right after sending it could make a busy
// walsender fail its next write and exit before reading the update.
func (s *session) shutdown() error {
	ctx, cancel := context.WithDeadline(context.Background(), s.stopBy())
	defer cancel()
	var err error
	for s.head < len(s.queue) && err == nil {
		err = s.drain(ctx, true)
	}
	if s.stopWake != nil {
		s.stopWake()
	}
	if serr := s.sendStatus(ctx); err == nil {
		err = serr
	}
	_ = s.conn.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, cerr := pglogrepl.SendStandbyCopyDone(ctx, s.conn); err == nil && cerr != nil {
		err = fmt.Errorf("relay: end replication: %w", cerr)
	}
	s.relay.log.Info("relay stopped", "confirmed_lsn", s.confirmed.String(), "err", err)
	return err
}
