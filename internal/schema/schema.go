// Package schema applies converge's embedded migrations with golang-migrate
// and reports whether a database is current. `converge migrate up` and the
// writer's readiness check use it; nothing else changes the schema.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/migrations"
)

// ErrDirty reports a migration that failed halfway. Up settles it itself
// (a migration is all applied or not at all); Check reports it until then.
var ErrDirty = errors.New("schema: database is dirty (a migration failed halfway)")

// Status is where a database stands against the embedded migrations.
type Status struct {
	Version uint // applied version, 0 when none
	Latest  uint // newest embedded version
	Dirty   bool
}

// Current reports whether the applied version is the newest embedded one.
func (s Status) Current() bool { return !s.Dirty && s.Version == s.Latest }

// Up applies every pending migration, then grants converge's roles their
// privileges on the tables and sequences (roles.Grant: what a migration
// created is the runner's, so only it can grant it; roles that do not exist
// are skipped). Re-running it changes nothing.
func Up(ctx context.Context, databaseURL string) (Status, error) {
	m, err := newMigrate(databaseURL)
	if err != nil {
		return Status{}, err
	}
	defer m.Close()
	// One Up at a time: a dirty version is settled, and the migrations
	// run, by the one holding the lock.
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return Status{}, fmt.Errorf("schema: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('converge.schema', 0))`); err != nil {
		return Status{}, fmt.Errorf("schema: lock: %w", err)
	}
	if err := recoverDirty(ctx, m, conn); err != nil {
		return Status{}, err
	}
	done := make(chan error, 1)
	go func() { done <- m.Up() }()
	select {
	case <-ctx.Done():
		m.GracefulStop <- true
		<-done //nolint:errcheck // cancelled: ctx.Err() is the answer
		return Status{}, ctx.Err()
	case err = <-done:
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return Status{}, fmt.Errorf("schema: migrate up: %w", err)
	}
	v, dirty, err := m.Version()
	if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
		return Status{}, fmt.Errorf("schema: read version: %w", err)
	}
	latest, err := LatestVersion()
	if err != nil {
		return Status{}, err
	}
	st := Status{Version: v, Latest: latest, Dirty: dirty}
	if dirty {
		return st, nil
	}
	if err := grant(ctx, databaseURL); err != nil {
		return st, err
	}
	return st, nil
}

func grant(ctx context.Context, databaseURL string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("schema: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if err := roles.Grant(ctx, conn); err != nil {
		return fmt.Errorf("schema: grant the roles: %w", err)
	}
	return nil
}

// Check reads the applied version over an existing connection, without
// taking golang-migrate's lock, for readiness probes.
func Check(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (Status, error) {
	latest, err := LatestVersion()
	if err != nil {
		return Status{}, err
	}
	var (
		v     int64
		dirty bool
	)
	err = db.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations LIMIT 1`).Scan(&v, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows), isUndefinedTable(err):
		// Never migrated: version 0, which the caller reports as behind.
		return Status{Latest: latest}, nil
	case err != nil:
		return Status{Latest: latest}, fmt.Errorf("schema: read version: %w", err)
	}
	st := Status{Version: uint(v), Latest: latest, Dirty: dirty}
	if dirty {
		return st, ErrDirty
	}
	return st, nil
}

func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

var migrationName = regexp.MustCompile(`^(\d+)_.*\.up\.sql$`)

// LatestVersion is the newest migration embedded in this binary.
func LatestVersion() (uint, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return 0, fmt.Errorf("schema: read embedded migrations: %w", err)
	}
	var latest uint64
	for _, e := range entries {
		if m := migrationName.FindStringSubmatch(e.Name()); m != nil {
			n, err := strconv.ParseUint(m[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("schema: migration %s: %w", e.Name(), err)
			}
			latest = max(latest, n)
		}
	}
	return uint(latest), nil
}

func newMigrate(databaseURL string) (*migrate.Migrate, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("schema: open embedded migrations: %w", err)
	}
	dbURL, err := migrateURL(databaseURL)
	if err != nil {
		return nil, err
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, dbURL)
	if err != nil {
		return nil, fmt.Errorf("schema: connect: %w", err)
	}
	return m, nil
}

// migrateURL turns a postgres:// DSN into golang-migrate's pgx5:// form.
func migrateURL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("schema: database URL must be postgres://...: %q", redact(databaseURL))
	}
	u.Scheme = "pgx5"
	return u.String(), nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	if i := strings.Index(s, "@"); i >= 0 {
		return "***" + s[i:]
	}
	return s
}

// Inspect connects to databaseURL and reports its status without changing
// anything. A database never migrated reports version 0.
func Inspect(ctx context.Context, databaseURL string) (Status, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return Status{}, fmt.Errorf("schema: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return Status{}, fmt.Errorf("schema: inspect: %w", err)
	}
	if !exists {
		latest, err := LatestVersion()
		return Status{Latest: latest}, err
	}
	st, err := Check(ctx, conn)
	if errors.Is(err, ErrDirty) {
		return st, nil
	}
	return st, err
}
