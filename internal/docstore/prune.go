package docstore

import (
	"context"
	"fmt"
	"time"
)

// PruneOutbox deletes at most limit outbox rows created more than olderThan
// ago, oldest first, and returns how many it deleted. The relay reads the
// outbox from WAL, not from the table, so a row is not needed once its
// transaction has committed; retention only keeps recent events at hand
// for inspection. Small batches keep each delete's locks and WAL short.
func (s *Store) PruneOutbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM outbox WHERE event_id IN (
			SELECT event_id FROM outbox WHERE created_at < now() - make_interval(secs => $1)
			ORDER BY created_at LIMIT $2)`, olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("docstore: prune outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
