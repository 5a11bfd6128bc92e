// The replication slot: created on the first start, its position read,
// and the errors that say another relay or another database has it.

package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// errSlotActive means another relay holds the slot: wait as a standby.
var errSlotActive = errors.New("relay: replication slot is active in another session")

// failoverSlots reports whether the server creates failover slots
// (PostgreSQL 17 and later).
func failoverSlots(ctx context.Context, conn *pgconn.PgConn) bool {
	res, err := conn.Exec(ctx, "SHOW server_version_num").ReadAll()
	if err != nil || len(res) == 0 || len(res[0].Rows) == 0 {
		return false
	}
	v, err := strconv.Atoi(string(res[0].Rows[0][0]))
	return err == nil && v >= 170000
}

// ensureSlot creates the slot on first start and returns its confirmed
// position.
func ensureSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (pglogrepl.LSN, bool, error) {
	lsn, ok, err := slotPosition(ctx, conn, slot)
	if err != nil || ok {
		return lsn, false, err
	}
	if failoverSlots(ctx, conn) {
		// PostgreSQL 17+: the slot is synchronised to standbys that have
		// sync_replication_slots on, and survives their promotion.
		_, err = conn.Exec(ctx, `CREATE_REPLICATION_SLOT "`+slot+`" LOGICAL pgoutput (FAILOVER true)`).ReadAll()
	} else {
		_, err = pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	}
	var pgErr *pgconn.PgError
	created := err == nil
	if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "42710") { // 42710: created meanwhile by another relay
		return 0, false, fmt.Errorf("relay: create slot %s: %w", slot, err)
	}
	lsn, _, err = slotPosition(ctx, conn, slot)
	return lsn, created, err
}

func slotPosition(ctx context.Context, conn *pgconn.PgConn, slot string) (pglogrepl.LSN, bool, error) {
	// The slot name is validated as an identifier; replication connections
	// accept only the simple protocol, so it is inlined.
	res, err := conn.Exec(ctx, "SELECT coalesce(confirmed_flush_lsn::text, '0/0'), coalesce(database = current_database(), false), coalesce(database, '') "+
		"FROM pg_replication_slots WHERE slot_name = '"+slot+"'").ReadAll()
	if err != nil {
		return 0, false, fmt.Errorf("relay: read slot %s: %w", slot, err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return 0, false, nil
	}
	row := res[0].Rows[0]
	if string(row[1]) != "t" {
		// Slot names are cluster-wide: this one belongs to another database
		// (or is not a logical slot). Waiting would never help.
		return 0, false, &slotElsewhereError{slot: slot, database: string(row[2])}
	}
	lsn, err := pglogrepl.ParseLSN(string(row[0]))
	if err != nil {
		return 0, false, fmt.Errorf("relay: slot %s position: %w", slot, err)
	}
	return lsn, true, nil
}

// slotElsewhereError is a slot name taken in another database: a
// configuration error, not a transient one.
type slotElsewhereError struct{ slot, database string }

func (e *slotElsewhereError) Error() string {
	return fmt.Sprintf("relay: replication slot %q belongs to database %q, not this one: give this relay another -slot", e.slot, e.database)
}
