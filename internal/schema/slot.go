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
// after its creation. Until a relay consumes it, the slot retains WAL. On
// PostgreSQL 17 and later it is a failover slot, as the relay makes it:
// synchronised to standbys with sync_replication_slots on, it survives
// their promotion.
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
	_, err = conn.Exec(ctx, createSlotSQL(serverVersion(ctx, conn)), slot)
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

// serverVersion is the server's server_version_num (0 when unknown).
func serverVersion(ctx context.Context, conn *pgx.Conn) int {
	var v int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0
	}
	return v
}

// createSlotSQL creates the slot $1: with failover from PostgreSQL 17
// (version as server_version_num), whose function takes the flag.
func createSlotSQL(version int) string {
	if version >= 170000 {
		// (slot_name, plugin, temporary, twophase, failover)
		return `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	return `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`
}
