// Standby status updates: the confirmed position recorded in JetStream,
// then reported to Postgres, and the marks taken at each update.

package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

func (s *session) sendStatus(ctx context.Context) error {
	s.nextStatus = time.Now().Add(s.relay.cfg.StatusInterval)
	deadline := s.nextStatus
	if s.finishing && s.finishBy.Before(deadline) {
		deadline = s.finishBy
	}
	// After cancellation the wake-up deadline stands, unless the session is
	// finishing its transaction.
	if ctx.Err() == nil || s.finishing {
		if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
			return fmt.Errorf("relay: set read deadline: %w", err)
		}
	}
	if s.db != nil && ctx.Err() == nil {
		if err := s.takeMark(ctx); err != nil {
			return err
		}
	}
	report := s.confirmed
	if s.pos != nil {
		// Recorded before Postgres hears of it, so that the slot never
		// starts past the record: a restart then trusts the slot and needs
		// no catch-up. When it cannot be recorded (NATS is away), Postgres
		// hears of no more than was; shutting down, the last position is
		// recorded too.
		rctx := ctx
		if ctx.Err() != nil {
			rctx = context.Background()
		}
		if err := s.pos.Record(rctx, s.confirmed); err != nil {
			s.relay.log.Warn("recording the confirmed position failed", "err", err)
			report = min(report, max(s.pos.written, s.reported))
		}
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: report, WALFlushPosition: report, WALApplyPosition: report,
		ClientTime: s.relay.cfg.Clock.Now(),
	})
	if err != nil {
		return fmt.Errorf("relay: standby status update: %w", err)
	}
	s.reported = max(s.reported, report)
	return nil
}

// takeMark turns the pending mark into a mark once the confirmed position
// reached its LSN, and takes a new snapshot when none is pending. It reads
// too whether Postgres has synchronous standbys now. An error ends the
// session: the connection holds the slot's lock.
func (s *session) takeMark(ctx context.Context) error {
	if m := s.pendingMark; m != nil && s.confirmed >= m.lsn() {
		s.pos.addMark(*m)
		s.pendingMark = nil
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var snap, lsn, syncNames string
	if err := s.db.QueryRow(qctx, `SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text, current_setting('synchronous_standby_names')`).Scan(&snap, &lsn, &syncNames); err != nil {
		return fmt.Errorf("relay: read a snapshot: %w", err)
	}
	parsed, err := parseSnapshot(snap)
	if err != nil {
		return err
	}
	s.snap = parsed
	s.setGated(syncNames != "")
	if s.pendingMark == nil {
		s.pendingMark = &Mark{Snapshot: snap, LSN: lsn, Timeline: s.timeline, At: s.relay.cfg.Clock.Now().UTC()}
	}
	return nil
}
