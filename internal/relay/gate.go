// With synchronous standbys, a transaction is published only once it is
// visible on the primary: once they confirmed its commit.

package relay

import (
	"context"
	"fmt"
	"time"
)

func (s *session) setGated(on bool) {
	if on != s.gated {
		s.relay.log.Info("synchronous standbys changed: a transaction is published once they confirmed it", "slot", s.relay.cfg.Slot, "synchronous", on)
	}
	s.gated = on
	s.relay.metrics.Gated.Set(map[bool]float64{true: 1, false: 0}[on])
}

// awaitVisible returns once the transaction xid is visible on the
// primary: committed, and confirmed by the synchronous standbys (Postgres
// makes a commit visible only after they did). Until then it is not
// published: a primary that dies first leaves a standby without it, and
// the streams must not hold what Postgres no longer has. Postgres hears
// from the session meanwhile.
func (s *session) awaitVisible(ctx context.Context, xid uint32) error {
	if !s.gated || s.snap.complete(xid) {
		return nil
	}
	start := time.Now()
	defer func() { s.relay.metrics.GateWait.Observe(time.Since(start).Seconds()) }()
	wait := 200 * time.Microsecond
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var snap string
		err := s.db.QueryRow(qctx, `SELECT pg_current_snapshot()::text`).Scan(&snap)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return errStopped
			}
			return fmt.Errorf("relay: read a snapshot: %w", err)
		}
		parsed, err := parseSnapshot(snap)
		if err != nil {
			return err
		}
		s.snap = parsed
		if s.snap.complete(xid) {
			return nil
		}
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return errStopped
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}
