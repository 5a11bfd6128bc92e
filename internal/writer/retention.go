package writer

import (
	"context"
	"log/slog"
	"time"
)

// OutboxPruner is what outbox retention needs of the store.
type OutboxPruner interface {
	PruneOutbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// RetentionConfig of the outbox.
type RetentionConfig struct {
	Retention time.Duration // rows older than this are deleted; 0: 24h; <0: never
	Interval  time.Duration // how often to look; default 1m
	Batch     int           // rows per delete; default 1000
}

// Default values of [RetentionConfig]; the writer's -outbox-retention
// defaults to DefaultOutboxRetention too.
const (
	DefaultOutboxRetention   = 24 * time.Hour
	DefaultRetentionInterval = time.Minute
	DefaultRetentionBatch    = 1000
)

// setDefaults fills the settings left zero; a negative Retention (never)
// stays.
func (c *RetentionConfig) setDefaults() {
	if c.Retention == 0 {
		c.Retention = DefaultOutboxRetention
	}
	if c.Interval <= 0 {
		c.Interval = DefaultRetentionInterval
	}
	if c.Batch <= 0 {
		c.Batch = DefaultRetentionBatch
	}
}

// RunOutboxRetention deletes old outbox rows in small batches until ctx
// ends. The writer does it because it is the only writer of Postgres.
func RunOutboxRetention(ctx context.Context, p OutboxPruner, cfg RetentionConfig, m *Metrics, log *slog.Logger) {
	if cfg.Retention < 0 {
		return
	}
	cfg.setDefaults()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			n, err := p.PruneOutbox(ctx, cfg.Retention, cfg.Batch)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("outbox retention failed; retrying at the next interval", "err", err)
				}
				break
			}
			if m != nil {
				m.OutboxPruned.Add(float64(n))
			}
			if n < int64(cfg.Batch) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
