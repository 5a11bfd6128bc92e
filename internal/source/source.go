// Package source maps tables a team already has to documents. A
// [Mapping] names a table, the column that identifies its rows, and SQL
// expressions over a row that give a document's key, title, body, tags,
// links and meta. [Apply] installs it in the table's database, as the
// table's owner:
//
//   - a view, converge_source_<name>, in the table's schema, giving each
//     row's document (row_id, key, title, body, tags, links, meta), on
//     which the writer alone is granted SELECT: the writer reads a row's
//     document through it, with the view owner's rights on the table;
//   - statement triggers on the table and on each table it follows (a
//     join table that holds the tags, say), which hand over, in the
//     transaction that changed them, the identities of the changed rows
//     (converge_inbox rows with source and row_id set; migration 9): a
//     rollback hands over nothing;
//   - a trigger refusing TRUNCATE, which would skip the withdrawals.
//
// When the mapping is new or changed it hands over every row of the table
// in the same transaction (a backfill, or the re-emission of a changed
// mapping); the table is locked against writes meanwhile (CREATE TRIGGER
// takes SHARE ROW EXCLUSIVE), so no change falls between the backfill and
// the triggers.
//
// The writer applies each handed-over row as a PUT of the document the
// view gives now, at the next version of its key (and a withdrawal when
// the view gives none, or of the old key when the key changed), one row at
// a time under an advisory lock: versions follow the order of commits,
// and the last commit's state is the one applied.
package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"
)

// ViewPrefix starts the name of every source's view: the view of source
// name is ViewPrefix+name.
const ViewPrefix = "converge_source_"

// WriterRole is granted SELECT on each source's view.
const WriterRole = "converge_writer"

// Mapping of a table to documents. Expressions are SQL over one row of
// Table, which they name by its unqualified name (articles.id) or not at
// all (id).
type Mapping struct {
	// Name of the source: a lower-case letter, then up to 37 lower-case
	// letters, digits or underscores (its triggers' names, which hold it,
	// are Postgres identifiers of at most 63 bytes).
	Name string `yaml:"-"`
	// Table is the mapped table, [schema.]name.
	Table string `yaml:"table"`
	// Row is the column that identifies a row (its primary key); default
	// "id".
	Row string `yaml:"row"`
	// Key gives the document's key; default '<Name>/' || <Row>.
	Key string `yaml:"key"`
	// Title, Body: text; default ''.
	Title string `yaml:"title"`
	Body  string `yaml:"body"`
	// Tags, Links: text[]; default '{}'.
	Tags  string `yaml:"tags"`
	Links string `yaml:"links"`
	// Meta: jsonb (an object); default '{}'.
	Meta string `yaml:"meta"`
	// Where, when given, keeps the rows it is true of: a row for which
	// it becomes false is withdrawn.
	Where string `yaml:"where"`
	// Follow are other tables whose changes change rows' documents (the
	// tags' join table): a change of one of their rows hands over the
	// row of Table its column Row names.
	Follow []Follow `yaml:"follow"`
}

// Follow is a table a mapping's documents depend on.
type Follow struct {
	Table string `yaml:"table"`
	// Row is the column holding the mapped table's row identity.
	Row string `yaml:"row"`
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,37}$`)

// Validate checks the mapping's names; its expressions are checked by
// Postgres when Apply creates the view.
func (m *Mapping) Validate() error {
	if !namePattern.MatchString(m.Name) {
		return fmt.Errorf("source %q: the name must be a lower-case letter then up to 37 lower-case letters, digits or underscores", m.Name)
	}
	if m.Table == "" {
		return fmt.Errorf("source %s: table is required", m.Name)
	}
	if _, err := splitTable(m.Table); err != nil {
		return fmt.Errorf("source %s: table: %w", m.Name, err)
	}
	for i, f := range m.Follow {
		if _, err := splitTable(f.Table); err != nil || f.Table == "" {
			return fmt.Errorf("source %s: follow %d: table %q: a [schema.]name is required", m.Name, i+1, f.Table)
		}
		if f.Row == "" {
			return fmt.Errorf("source %s: follow %d (%s): row, the column naming the row of %s, is required", m.Name, i+1, f.Table, m.Table)
		}
	}
	return nil
}

func (m Mapping) row() string {
	if m.Row == "" {
		return "id"
	}
	return m.Row
}

// splitTable splits [schema.]name; quoting is not needed (nor accepted).
func splitTable(t string) ([]string, error) {
	parts := strings.Split(t, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: expected [schema.]name", t)
	}
	for _, p := range parts {
		if p == "" || strings.ContainsAny(p, "\"; \t\n") {
			return nil, fmt.Errorf("%q: expected [schema.]name", t)
		}
	}
	return parts, nil
}

// Parse reads the sources section of a configuration file: a mapping of
// source names to mappings. path names the file in errors.
func Parse(path string, node *yaml.Node) ([]Mapping, error) {
	if node == nil {
		return nil, nil
	}
	if node.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s:%d: sources must be a mapping of source names to their mappings", path, node.Line)
	}
	known := []string{"table", "row", "key", "title", "body", "tags", "links", "meta", "where", "follow"}
	var out []Mapping
	for i := 0; i+1 < len(node.Content); i += 2 {
		k, v := node.Content[i], node.Content[i+1]
		if v.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("config file %s:%d: sources.%s must be a mapping (table, row, key, title, body, tags, links, meta, where, follow)", path, v.Line, k.Value)
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			if f := v.Content[j]; !slices.Contains(known, f.Value) {
				return nil, fmt.Errorf("config file %s:%d: sources.%s: unknown setting %q (the settings: %s)", path, f.Line, k.Value, f.Value, strings.Join(known, ", "))
			}
		}
		var m Mapping
		if err := v.Decode(&m); err != nil {
			return nil, fmt.Errorf("config file %s:%d: sources.%s: %w", path, v.Line, k.Value, err)
		}
		m.Name = k.Value
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("config file %s:%d: %w", path, k.Line, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// table is a resolved table: its schema and name, quoted.
type table struct{ schema, name string }

func (t table) String() string { return pgx.Identifier{t.schema, t.name}.Sanitize() }

// resolve finds t as the connected role sees it (its search path).
func resolve(ctx context.Context, q querier, t string) (table, error) {
	var out table
	err := q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, t).Scan(&out.schema, &out.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, fmt.Errorf("table %s not found (or not visible to this role)", t)
	}
	return out, err
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// View is the view of source name, quoted, in schema.
func View(schema, name string) string { return pgx.Identifier{schema, ViewPrefix + name}.Sanitize() }

func or(expr, def string) string {
	if strings.TrimSpace(expr) == "" {
		return def
	}
	return expr
}

// viewQuery is the view's SELECT over t.
func (m Mapping) viewQuery(t table) string {
	row := pgx.Identifier{t.name, m.row()}.Sanitize()
	key := or(m.Key, fmt.Sprintf("%s || (%s)::text", quoteLiteral(m.Name+"/"), row))
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s AS row_id,\n", row)
	fmt.Fprintf(&b, "    (%s)::text AS key,\n", key)
	fmt.Fprintf(&b, "    (%s)::text AS title,\n", or(m.Title, "''"))
	fmt.Fprintf(&b, "    (%s)::text AS body,\n", or(m.Body, "''"))
	fmt.Fprintf(&b, "    (%s)::text[] AS tags,\n", or(m.Tags, "'{}'"))
	fmt.Fprintf(&b, "    (%s)::text[] AS links,\n", or(m.Links, "'{}'"))
	fmt.Fprintf(&b, "    (%s)::jsonb AS meta\n", or(m.Meta, "'{}'"))
	fmt.Fprintf(&b, "FROM %s AS %s", t, pgx.Identifier{t.name}.Sanitize())
	if strings.TrimSpace(m.Where) != "" {
		fmt.Fprintf(&b, "\nWHERE %s", m.Where)
	}
	return b.String()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// triggerNames are the names of a source's triggers, on its table and
// on each table it follows.
func triggerNames(name string) []string {
	var out []string
	for _, op := range []string{"insert", "update", "delete", "truncate"} {
		out = append(out, ViewPrefix+name+"_"+op)
	}
	return out
}

// triggers are the statements creating a source's triggers on t, whose
// column col gives the mapped row's identity.
func triggers(name string, t table, col string) []string {
	names := triggerNames(name)
	args := quoteLiteral(name) + ", " + quoteLiteral(col)
	return []string{
		fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT ON %s REFERENCING NEW TABLE AS converge_new FOR EACH STATEMENT EXECUTE FUNCTION public.converge_source_changed(%s)", pgx.Identifier{names[0]}.Sanitize(), t, args),
		fmt.Sprintf("CREATE TRIGGER %s AFTER UPDATE ON %s REFERENCING OLD TABLE AS converge_old NEW TABLE AS converge_new FOR EACH STATEMENT EXECUTE FUNCTION public.converge_source_changed(%s)", pgx.Identifier{names[1]}.Sanitize(), t, args),
		fmt.Sprintf("CREATE TRIGGER %s AFTER DELETE ON %s REFERENCING OLD TABLE AS converge_old FOR EACH STATEMENT EXECUTE FUNCTION public.converge_source_changed(%s)", pgx.Identifier{names[2]}.Sanitize(), t, args),
		fmt.Sprintf("CREATE TRIGGER %s BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION public.converge_source_truncate(%s)", pgx.Identifier{names[3]}.Sanitize(), t, quoteLiteral(name)),
	}
}

// plan is what Apply runs for one mapping.
type plan struct {
	table     table
	view      string
	query     string
	digest    string   // of the view and the followed tables
	triggers  []string // CREATE TRIGGER statements
	triggerOn []table  // the tables with triggers
}

func (m Mapping) plan(ctx context.Context, q querier) (plan, error) {
	if err := m.Validate(); err != nil {
		return plan{}, err
	}
	t, err := resolve(ctx, q, m.Table)
	if err != nil {
		return plan{}, fmt.Errorf("source %s: %w", m.Name, err)
	}
	p := plan{table: t, view: View(t.schema, m.Name), query: m.viewQuery(t), triggerOn: []table{t}}
	p.triggers = triggers(m.Name, t, m.row())
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", p.view, p.query)
	for _, f := range m.Follow {
		ft, err := resolve(ctx, q, f.Table)
		if err != nil {
			return plan{}, fmt.Errorf("source %s: follow: %w", m.Name, err)
		}
		p.triggers = append(p.triggers, triggers(m.Name, ft, f.Row)...)
		p.triggerOn = append(p.triggerOn, ft)
		fmt.Fprintf(h, "follow %s %s\n", ft, f.Row)
	}
	p.digest = hex.EncodeToString(h.Sum(nil))[:16]
	return p, nil
}

func (p plan) comment(name string) string { return "converge source " + name + " " + p.digest }

// SQL is what Apply runs for m, as a script a database administrator can
// read (or run): the view, its grant, the triggers, and the backfill.
// The connection resolves the tables as Apply would.
func SQL(ctx context.Context, conn *pgx.Conn, m Mapping) (string, error) {
	p, err := m.plan(ctx, conn)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- source %s: %s.%s mapped to documents\nBEGIN;\n", m.Name, p.table.schema, p.table.name)
	fmt.Fprintf(&b, "DROP VIEW IF EXISTS %s;\nCREATE VIEW %s AS\n%s;\n", p.view, p.view, p.query)
	fmt.Fprintf(&b, "COMMENT ON VIEW %s IS %s;\n", p.view, quoteLiteral(p.comment(m.Name)))
	fmt.Fprintf(&b, "GRANT SELECT ON %s TO %s;\n", p.view, WriterRole)
	fmt.Fprintf(&b, "GRANT USAGE ON SCHEMA %s TO %s; -- when it has none\n", pgx.Identifier{p.table.schema}.Sanitize(), WriterRole)
	for _, t := range p.triggerOn {
		for _, n := range triggerNames(m.Name) {
			fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", pgx.Identifier{n}.Sanitize(), t)
		}
	}
	for _, s := range p.triggers {
		b.WriteString(s + ";\n")
	}
	fmt.Fprintf(&b, "-- the backfill: every row handed over\nINSERT INTO public.converge_inbox (source, row_id) SELECT %s, (%s)::text FROM %s WHERE %s IS NOT NULL;\nCOMMIT;\n",
		quoteLiteral(m.Name), pgx.Identifier{m.row()}.Sanitize(), p.table, pgx.Identifier{m.row()}.Sanitize())
	return b.String(), nil
}
