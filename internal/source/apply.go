package source

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Result of applying one mapping.
type Result struct {
	Name  string
	Table string // the mapped table, schema.name
	View  string // its view, schema.name
	// Created: the source was not installed; Changed: its mapping
	// differed from the installed one. Either hands every row over.
	Created, Changed bool
	// HandedOver is how many rows were handed over (the backfill).
	HandedOver int64
}

// Apply installs m in conn's database, in one transaction: the view (made
// again when the mapping changed), its grant to the writer, the triggers
// on the table and on the tables it follows (made again, so that a table
// no longer followed loses them), and, when the mapping is new or changed
// or reemit is set, every row of the table handed over. The connected
// role must own the tables (or hold TRIGGER on them), may create in the
// table's schema, and may hand over (converge_producer).
func Apply(ctx context.Context, conn *pgx.Conn, m Mapping, reemit bool) (Result, error) {
	res := Result{Name: m.Name}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		p, err := m.plan(ctx, tx)
		if err != nil {
			return err
		}
		res.Table, res.View = p.table.schema+"."+p.table.name, p.table.schema+"."+ViewPrefix+m.Name
		var old *string
		if err := tx.QueryRow(ctx, `SELECT obj_description(to_regclass($1), 'pg_class')`, p.view).Scan(&old); err != nil {
			return fmt.Errorf("source %s: read the installed view: %w", m.Name, err)
		}
		var installed bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.view).Scan(&installed); err != nil {
			return err
		}
		res.Created = !installed
		res.Changed = installed && (old == nil || *old != p.comment(m.Name))
		// Old triggers first: a table no longer followed keeps none, and
		// their tables are locked against writes from here to the commit.
		rows, err := tx.Query(ctx, `SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE tgname = ANY($1)`, triggerNames(m.Name))
		if err != nil {
			return err
		}
		type trig struct{ on, name string }
		olds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (trig, error) {
			var t trig
			return t, r.Scan(&t.on, &t.name)
		})
		if err != nil {
			return fmt.Errorf("source %s: read the installed triggers: %w", m.Name, err)
		}
		for _, t := range olds {
			if _, err := tx.Exec(ctx, fmt.Sprintf("DROP TRIGGER %s ON %s", pgx.Identifier{t.name}.Sanitize(), t.on)); err != nil {
				return fmt.Errorf("source %s: drop trigger %s on %s: %w", m.Name, t.name, t.on, err)
			}
		}
		// Without converge's roles (a writer connecting as the tables'
		// owner) there is nobody to grant to.
		var writerRole bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, WriterRole).Scan(&writerRole); err != nil {
			return err
		}
		usage := !writerRole
		if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = $1) OR has_schema_privilege($1, $2, 'USAGE')`, WriterRole, p.table.schema).Scan(&usage); err != nil {
			return fmt.Errorf("source %s: %w", m.Name, err)
		}
		if !usage {
			if _, err := tx.Exec(ctx, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{p.table.schema}.Sanitize(), WriterRole)); err != nil {
				return fmt.Errorf("source %s: %w", m.Name, explain(err, "let the writer into the table's schema"))
			}
		}
		for _, s := range p.triggers {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("source %s: %w", m.Name, explain(err, "create its triggers"))
			}
		}
		if res.Created || res.Changed {
			stmts := []string{
				"DROP VIEW IF EXISTS " + p.view,
				fmt.Sprintf("CREATE VIEW %s AS\n%s", p.view, p.query),
				fmt.Sprintf("COMMENT ON VIEW %s IS %s", p.view, quoteLiteral(p.comment(m.Name))),
			}
			if writerRole {
				stmts = append(stmts, fmt.Sprintf("GRANT SELECT ON %s TO %s", p.view, WriterRole))
			}
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					return fmt.Errorf("source %s: %w", m.Name, explain(err, "create its view"))
				}
			}
		}
		if res.Created || res.Changed || reemit {
			// A row without an identity gives no document (the triggers
			// skip it too).
			col := pgx.Identifier{m.row()}.Sanitize()
			tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO public.converge_inbox (source, row_id) SELECT $1, (%s)::text FROM %s WHERE %s IS NOT NULL`,
				col, p.table, col), m.Name)
			if err != nil {
				return fmt.Errorf("source %s: %w", m.Name, explain(err, "hand its rows over"))
			}
			res.HandedOver = tag.RowsAffected()
		}
		return nil
	})
	return res, err
}

// explain adds to a Postgres error what converge source needs from the
// role that applies it.
func explain(err error, doing string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("%s: %w (the role applying a source must own its tables, may create in their schema, and must be granted converge_producer)", doing, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// Status of one source, as converge's reader sees it.
type Status struct {
	Name string
	// Rows is how many of its rows give a document now.
	Rows int64
	// Pending rows handed over and not yet applied; Refused, kept with
	// the reason in converge_inbox.
	Pending, Refused int64
}

// ReadStatus reads every source's status, by name: those with rows
// given, pending or refused.
func ReadStatus(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]Status, error) {
	rows, err := q.Query(ctx, `SELECT source, sum(given), sum(pending), sum(refused) FROM (
		SELECT source, count(*) AS given, 0 AS pending, 0 AS refused FROM converge_mapped_rows GROUP BY source
		UNION ALL
		SELECT source, 0, count(*) FILTER (WHERE refused_at IS NULL), count(*) FILTER (WHERE refused_at IS NOT NULL)
		FROM converge_inbox WHERE source IS NOT NULL GROUP BY source) s
		GROUP BY source ORDER BY source`)
	if err != nil {
		return nil, fmt.Errorf("source: read the sources' status (is the schema at version 9?): %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Status, error) {
		var s Status
		return s, r.Scan(&s.Name, &s.Rows, &s.Pending, &s.Refused)
	})
}
