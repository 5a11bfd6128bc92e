// The session's loop: replication messages received, the outbox's
// inserts published within the window, and the shutdown that confirms
// what was acknowledged.

package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/converge-sync/converge/internal/telemetry"
)

// HeartbeatPrefix is the prefix of the relay's logical heartbeat messages.
const HeartbeatPrefix = "converge.heartbeat"

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
		effects := ""
		if i == 1 {
			subject, effects = s.relay.effectsTarget(subject)
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
		s.queue = append(s.queue, pending{pub: true, effects: effects != "", seq: seq, sent: now, commitTime: s.commitTime,
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
