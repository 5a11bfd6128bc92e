package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// monitor emits heartbeats and measures slot lag over an ordinary
// connection, independent of the replication session.
type monitor struct {
	cfg     Config
	metrics *Metrics
	log     *slog.Logger
	conn    *pgx.Conn
}

func (m *monitor) run(ctx context.Context) {
	defer func() {
		if m.conn != nil {
			_ = m.conn.Close(context.Background())
		}
	}()
	lag := time.NewTicker(m.cfg.LagCheckInterval)
	defer lag.Stop()
	var beat <-chan time.Time
	if m.cfg.HeartbeatInterval > 0 {
		t := time.NewTicker(m.cfg.HeartbeatInterval)
		defer t.Stop()
		beat = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat:
			m.exec(ctx, "heartbeat", func(ctx context.Context, c *pgx.Conn) error {
				// Non-transactional: decoded at once, outside any transaction,
				// so an idle relay can confirm past it.
				_, err := c.Exec(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, HeartbeatPrefix)
				return err
			})
		case <-lag.C:
			m.exec(ctx, "slot lag", m.checkLag)
		}
	}
}

func (m *monitor) checkLag(ctx context.Context, c *pgx.Conn) error {
	var lag int64
	err := c.QueryRow(ctx, `
		SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, m.cfg.Slot).Scan(&lag)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // not created yet
	}
	if err != nil {
		return err
	}
	m.metrics.SlotLagBytes.Set(float64(lag))
	if lag > m.cfg.LagAlarmBytes {
		// Logged at every check while exceeded, not once after the fact.
		m.log.Warn("slot lag above alarm threshold: WAL is being retained", "slot", m.cfg.Slot,
			"lag_bytes", lag, "threshold_bytes", m.cfg.LagAlarmBytes)
	}
	return nil
}

func (m *monitor) exec(ctx context.Context, what string, f func(context.Context, *pgx.Conn) error) {
	// Bounded, so a half-open connection cannot stall heartbeats or shutdown.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m.conn == nil || m.conn.IsClosed() {
		c, err := pgx.Connect(ctx, m.cfg.PostgresURL)
		if err != nil {
			m.log.Debug("monitor connect failed", "what", what, "err", err)
			return
		}
		m.conn = c
	}
	if err := f(ctx, m.conn); err != nil {
		m.log.Debug("monitor query failed", "what", what, "err", err)
		_ = m.conn.Close(context.Background())
		m.conn = nil
	}
}
