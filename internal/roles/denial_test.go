package roles_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/roles"
)

// The writer changes rows, never the schema: it cannot create, alter, drop
// or truncate a table, nor create a replication slot or a publication.
func TestWriterCannotChangeTheSchemaNorReplicate(t *testing.T) {
	t.Parallel()
	d := newRoled(t)
	w := d.connect(t, roles.Writer)
	ctx := context.Background()
	for _, c := range []struct {
		what, sql, code, message string
	}{
		{"CREATE TABLE", `CREATE TABLE intruder (a int)`, pgerrcode.InsufficientPrivilege, "permission denied for schema public"},
		{"ALTER TABLE", `ALTER TABLE documents ADD COLUMN intruder int`, pgerrcode.InsufficientPrivilege, "must be owner of table documents"},
		{"DROP TABLE", `DROP TABLE outbox`, pgerrcode.InsufficientPrivilege, "must be owner of table outbox"},
		{"TRUNCATE", `TRUNCATE documents`, pgerrcode.InsufficientPrivilege, "permission denied for table documents"},
		{"pg_create_logical_replication_slot", `SELECT pg_create_logical_replication_slot('intruder', 'pgoutput')`,
			pgerrcode.InsufficientPrivilege, "must be superuser or replication role to use replication slots"},
		{"CREATE PUBLICATION", `CREATE PUBLICATION intruder FOR TABLE outbox`, pgerrcode.InsufficientPrivilege, "permission denied for database " + d.name},
	} {
		_, err := w.Exec(ctx, c.sql)
		refused(t, roles.Writer+": "+c.what, err, c.code, c.message)
	}
}

// The relay and the reader change no row of any table.
func TestRelayAndReaderCannotWrite(t *testing.T) {
	t.Parallel()
	d := newRoled(t)
	ctx := context.Background()
	for _, role := range []string{roles.Relay, roles.Reader} {
		conn := d.connect(t, role)
		for _, table := range roles.Tables {
			for _, c := range []struct{ what, sql string }{
				{"INSERT", "INSERT INTO " + table + " DEFAULT VALUES"},
				{"UPDATE", "UPDATE " + table + " SET " + firstColumn(t, conn, table) + " = " + firstColumn(t, conn, table)},
				{"DELETE", "DELETE FROM " + table},
			} {
				_, err := conn.Exec(ctx, c.sql)
				refused(t, fmt.Sprintf("%s: %s %s", role, c.what, table), err, pgerrcode.InsufficientPrivilege, "permission denied for table "+table)
			}
		}
	}
}

// firstColumn is a column of table, for an UPDATE that would change nothing
// if it were allowed.
func firstColumn(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	var col string
	// Not an identity column: Postgres refuses to set one before it
	// checks privileges.
	if err := conn.QueryRow(context.Background(), `SELECT attname FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND attidentity = '' AND NOT attisdropped ORDER BY attnum LIMIT 1`, table).Scan(&col); err != nil {
		t.Fatal(err)
	}
	return col
}

// A producer hands documents over and reads what it handed over, nothing
// more: it writes no document, chunk or outbox row, and cannot take, mark
// or delete a row of the inbox, which is the writer's to do.
func TestProducerOnlyHandsOver(t *testing.T) {
	t.Parallel()
	d := newRoled(t)
	ctx := context.Background()
	p := d.connect(t, roles.Producer)
	if _, err := p.Exec(ctx, `INSERT INTO converge_inbox (key, document) VALUES ('a', '{"version": 1, "body": "x"}')`); err != nil {
		t.Fatalf("a producer cannot hand a document over: %v", err)
	}
	var n int
	if err := p.QueryRow(ctx, `SELECT count(*) FROM converge_inbox WHERE refused_at IS NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a producer reads %d rows of the inbox (%v), want 1", n, err)
	}
	for _, table := range roles.Tables {
		cases := []struct{ what, sql string }{
			{"UPDATE", "UPDATE " + table + " SET " + firstColumn(t, p, table) + " = " + firstColumn(t, p, table)},
			{"DELETE", "DELETE FROM " + table},
		}
		if table != "converge_inbox" {
			cases = append(cases, struct{ what, sql string }{"INSERT", "INSERT INTO " + table + " DEFAULT VALUES"})
		}
		for _, c := range cases {
			_, err := p.Exec(ctx, c.sql)
			refused(t, fmt.Sprintf("%s: %s %s", roles.Producer, c.what, table), err, pgerrcode.InsufficientPrivilege, "permission denied for table "+table)
		}
	}
	_, err := p.Exec(ctx, `SELECT * FROM documents`)
	refused(t, roles.Producer+": SELECT documents", err, pgerrcode.InsufficientPrivilege, "permission denied for table documents")
}
