package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5"
)

// Each migration runs as one multi-statement query, which Postgres runs
// as one transaction: a migration killed halfway (its process SIGKILLed,
// its lock wait timed out) left all of it or none. golang-migrate marks
// the version dirty before it runs the migration and clean after, so a
// kill between the two leaves a dirty version it refuses to go past.
// recoverDirty settles it from what the database holds: applied, the
// version is marked clean; not applied, the version before it is, and Up
// runs the migration again.

// applied tells, for each migration, whether its change is in the
// database. A migration missing from it is run again (it must then be
// idempotent, as version 5 is); TestEveryMigrationHasACheck keeps the
// table complete.
var applied = map[uint]string{
	1: `SELECT to_regclass('outbox') IS NOT NULL`,
	2: `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'emission' AND NOT attisdropped)`,
	3: `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'documents'::regclass AND attname = 'meta_text' AND NOT attisdropped)`,
	4: `SELECT NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'chunks_key_fkey')`,
	5: ``, // lz4 compression, or nothing without lz4: idempotent, run again
	6: `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'trace_context' AND NOT attisdropped)`,
	7: `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'xid' AND NOT attisdropped)`,
	8: `SELECT to_regclass('converge_inbox') IS NOT NULL`,
	9: `SELECT to_regclass('converge_mapped_rows') IS NOT NULL`,
}

// recoverDirty marks a dirty version clean, or the one before it, from
// what the database holds; it does nothing to a clean database.
func recoverDirty(ctx context.Context, m *migrate.Migrate, conn *pgx.Conn) error {
	v, dirty, err := m.Version()
	if errors.Is(err, migrate.ErrNilVersion) || err == nil && !dirty {
		return nil
	}
	if err != nil {
		return fmt.Errorf("schema: read version: %w", err)
	}
	check, ok := applied[v]
	if !ok {
		return fmt.Errorf("%w: version %d is not one this binary knows (a newer converge's): run that version's migrate up", ErrDirty, v)
	}
	done := false
	if check != "" {
		if err := conn.QueryRow(ctx, check).Scan(&done); err != nil {
			return fmt.Errorf("schema: check whether migration %d was applied: %w", v, err)
		}
	}
	to := int(v)
	if !done {
		to-- // golang-migrate's -1 is no version at all
		if to == 0 {
			to = -1
		}
	}
	if err := m.Force(to); err != nil {
		return fmt.Errorf("schema: mark version %d clean: %w", to, err)
	}
	return nil
}
