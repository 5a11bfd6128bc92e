package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnsureSlot creates the relay's logical replication slot (pgoutput) if it
// does not exist, and reports whether it created it. Creating it with the
// schema closes the gap in which documents written before the relay's
// first start would never reach the stream: a slot only sees changes made
// after its creation. Until a relay consumes it, the slot retains WAL.
func EnsureSlot(ctx context.Context, databaseURL, slot string) (bool, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return false, fmt.Errorf("schema: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var here bool
	err = conn.QueryRow(ctx, `SELECT coalesce(database = current_database(), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&here)
	switch {
	case err == nil && here:
		return false, nil
	case err == nil:
		return false, fmt.Errorf("schema: replication slot %q belongs to another database: choose another slot name", slot)
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("schema: read slots: %w", err)
	}
	_, err = conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42710": // created meanwhile
		return false, nil
	case errors.As(err, &pgErr) && pgErr.Code == "55000":
		return false, fmt.Errorf("schema: cannot create replication slot %q (is wal_level=logical?): %w", slot, err)
	case err != nil:
		return false, fmt.Errorf("schema: create replication slot %q: %w", slot, err)
	}
	return true, nil
}
