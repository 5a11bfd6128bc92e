package roles

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/retry"
)

// Result is what [Apply] changed that was not there before.
type Result struct {
	Database        string
	CreatedDatabase bool
	CreatedRoles    []string
}

// Apply makes the cluster behind admin hold the definition: admin must be
// a connection of a role that may create roles and databases and grant on
// every object of the schema (a superuser, on PostgreSQL 15: only one may
// create a REPLICATION role). It creates the database when it is missing,
// then runs every other step of [Plan] in one transaction, connected to the
// database (admin itself, when it is connected there). Roles are the
// cluster's: an Apply on another database of the same cluster shares them
// (and sets the passwords it is given).
func Apply(ctx context.Context, admin *pgx.Conn, opts Options) (Result, error) {
	plan, err := Plan(opts)
	if err != nil {
		return Result{}, err
	}
	res := Result{Database: opts.database()}
	var inTx []Statement
	for _, s := range plan {
		if !s.BeforeTransaction {
			inTx = append(inTx, s)
			continue
		}
		ran, err := run(ctx, admin, s)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DuplicateDatabase: // created meanwhile
		case err != nil:
			return res, err
		case ran:
			res.CreatedDatabase = true
		}
	}

	conn := admin
	if admin.Config().Database != res.Database {
		cfg := admin.Config().Copy()
		cfg.Database = res.Database
		if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return res, fmt.Errorf("roles: connect to database %s: %w", res.Database, err)
		}
		defer conn.Close(context.Background())
	}
	err = retryConcurrent(ctx, func(ctx context.Context) error {
		res.CreatedRoles = nil
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			existing, err := existingRoles(ctx, tx)
			if err != nil {
				return err
			}
			for _, name := range Names() {
				if !existing[name] {
					res.CreatedRoles = append(res.CreatedRoles, name)
				}
			}
			for _, s := range inTx {
				if _, err := run(ctx, tx, s); err != nil {
					return err
				}
			}
			return nil
		})
	})
	return res, err
}

// Grant re-applies the privileges on the schema's tables and sequences
// (the last steps of [Plan]) in one transaction, for those of converge's
// roles that exist; with none of them, it does nothing. schema.Up runs it
// after the migrations, as their runner: the owner of what they created.
func Grant(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}) error {
	return retryConcurrent(ctx, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			existing, err := existingRoles(ctx, tx)
			if err != nil {
				return err
			}
			var present []Role
			for _, r := range Definition {
				if existing[r.Name] {
					present = append(present, r)
				}
			}
			if len(present) == 0 {
				return nil
			}
			for _, s := range objectGrants(present) {
				if _, err := run(ctx, tx, s); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// run executes s unless its condition says otherwise, and reports whether
// it did. Errors show s as printed, never its SQL (which may hold a
// verifier).
func run(ctx context.Context, q querier, s Statement) (bool, error) {
	if s.When != "" {
		var do bool
		if err := q.QueryRow(ctx, s.When).Scan(&do); err != nil {
			return false, fmt.Errorf("roles: %s: %w", s.When, err)
		}
		if !do {
			return false, nil
		}
	}
	if _, err := q.Exec(ctx, s.SQL); err != nil {
		return false, fmt.Errorf("roles: %s: %w", s.Shown, err)
	}
	return true, nil
}

func existingRoles(ctx context.Context, q querier) (map[string]bool, error) {
	rows, err := q.Query(ctx, `SELECT rolname FROM pg_roles WHERE rolname = ANY($1)`, Names())
	if err != nil {
		return nil, fmt.Errorf("roles: read roles: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("roles: read roles: %w", err)
	}
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// retryConcurrent runs fn again when it failed only because another
// session changed the same catalog rows at the same time: two Applies
// creating the same role, or granting on the same object.
func retryConcurrent(ctx context.Context, fn func(ctx context.Context) error) error {
	b := retry.Backoff{Min: 20 * time.Millisecond, Max: time.Second}
	return retry.Do(ctx, b, 8, func(ctx context.Context) error {
		err := fn(ctx)
		if err != nil && !concurrent(err) {
			return retry.Permanent(err)
		}
		return err
	})
}

func concurrent(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.UniqueViolation, pgerrcode.DuplicateObject, pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected:
		return true
	case pgerrcode.InternalError: // "tuple concurrently updated"
		return strings.Contains(pgErr.Message, "concurrently")
	}
	return false
}
