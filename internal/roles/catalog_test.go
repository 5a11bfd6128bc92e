package roles_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/schema"
)

// privileges are what the catalog says role may do on each relation of
// the schema: "documents" -> "DELETE INSERT SELECT UPDATE".
func privileges(t *testing.T, conn *pgx.Conn, role string) map[string]string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT c.relname, c.relkind::text, p.priv
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $2
		CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER','USAGE']) AS p(priv)
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')
		  AND CASE WHEN c.relkind = 'S' THEN p.priv IN ('SELECT', 'UPDATE', 'USAGE') AND has_sequence_privilege($1, c.oid, p.priv)
		           ELSE p.priv <> 'USAGE' AND has_table_privilege($1, c.oid, p.priv) END
		ORDER BY 1, 3`, role, roles.Schema)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var rel, kind, priv string
		if err := rows.Scan(&rel, &kind, &priv); err != nil {
			t.Fatal(err)
		}
		if kind == "S" {
			rel = "sequence " + rel
		}
		out[rel] = strings.TrimSpace(out[rel] + " " + priv)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// relations are the schema's tables and sequences, as "sequence x" for
// a sequence.
func relations(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT CASE WHEN c.relkind = 'S' THEN 'sequence ' ELSE '' END || c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S') ORDER BY 1`, roles.Schema)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// The catalog of a database migrated as the owner holds the definition
// exactly: the writer may change every table the migrations create (and
// use every sequence), and only read schema_migrations; the relay reads
// every table of the publication; no role but the writer changes a row;
// the owner owns every object; the roles' attributes and their privileges
// on the database and the schema are the definition's.
func TestCatalogHoldsTheDefinition(t *testing.T) {
	t.Parallel()
	d := newRoled(t)
	admin := d.connect(t, "postgres")
	ctx := context.Background()

	rels := relations(t, admin)
	if !slices.Contains(rels, "documents") || !slices.Contains(rels, "sequence outbox_emission_seq") {
		t.Fatalf("the migrated schema has %v", rels)
	}
	for _, rel := range rels {
		name := strings.TrimPrefix(rel, "sequence ")
		if !slices.Contains(roles.Tables, name) && !slices.Contains(roles.Sequences, name) {
			t.Errorf("%s is not in roles.Tables or roles.Sequences: add it there and grant it", rel)
		}
	}
	want := map[string]map[string]string{roles.Writer: {}, roles.Relay: {}, roles.Reader: {}, roles.Producer: {}}
	for _, rel := range rels {
		switch {
		case rel == "schema_migrations":
			want[roles.Writer][rel] = "SELECT"
		case rel == "converge_inbox":
			// Producers hand over; the writer takes, refuses, deletes.
			want[roles.Writer][rel] = "DELETE SELECT UPDATE"
			want[roles.Producer][rel] = "INSERT SELECT"
		case rel == "sequence converge_inbox_id_seq":
			// An identity column's: inserts need no privilege on it.
		case strings.HasPrefix(rel, "sequence "):
			want[roles.Writer][rel] = "USAGE"
		default:
			want[roles.Writer][rel] = "DELETE INSERT SELECT UPDATE"
		}
		if !strings.HasPrefix(rel, "sequence ") {
			want[roles.Reader][rel] = "SELECT"
		}
	}
	rows, err := admin.Query(ctx, `SELECT tablename FROM pg_publication_tables WHERE pubname = $1`, roles.Publication)
	if err != nil {
		t.Fatal(err)
	}
	published, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(published) == 0 {
		t.Fatalf("publication %s publishes %v (%v)", roles.Publication, published, err)
	}
	for _, table := range published {
		want[roles.Relay][table] = "SELECT"
	}
	for role, w := range want {
		got := privileges(t, admin, role)
		for _, rel := range rels {
			if got[rel] != w[rel] {
				t.Errorf("%s on %s: the catalog grants %q, want %q", role, rel, got[rel], w[rel])
			}
		}
	}

	var notOwned []string
	rows, err = admin.Query(ctx, `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S') AND c.relowner <> $2::regrole
		UNION ALL SELECT pubname FROM pg_publication WHERE pubowner <> $2::regrole`, roles.Schema, roles.Owner)
	if err == nil {
		notOwned, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(notOwned) > 0 {
		t.Errorf("not owned by %s: %v (%v)", roles.Owner, notOwned, err)
	}

	for _, r := range roles.Definition {
		var attrs string
		if err := admin.QueryRow(ctx, `
			SELECT format('login=%s super=%s createdb=%s createrole=%s replication=%s bypassrls=%s members_of=%s db=%s schema=%s',
				rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls,
				(SELECT count(*) FROM pg_auth_members WHERE member = r.oid),
				concat_ws(',', CASE WHEN has_database_privilege(r.oid, current_database(), 'CONNECT') THEN 'CONNECT' END,
				               CASE WHEN has_database_privilege(r.oid, current_database(), 'CREATE') THEN 'CREATE' END,
				               CASE WHEN has_database_privilege(r.oid, current_database(), 'TEMP') THEN 'TEMP' END),
				concat_ws(',', CASE WHEN has_schema_privilege(r.oid, $2, 'USAGE') THEN 'USAGE' END,
				               CASE WHEN has_schema_privilege(r.oid, $2, 'CREATE') THEN 'CREATE' END))
			FROM pg_roles r WHERE rolname = $1`, r.Name, roles.Schema).Scan(&attrs); err != nil {
			t.Fatal(err)
		}
		repl := map[bool]string{true: "t", false: "f"}[r.Replication]
		want := fmt.Sprintf("login=t super=f createdb=f createrole=f replication=%s bypassrls=f members_of=0 db=%s schema=%s",
			repl, strings.ReplaceAll(r.OnDatabase, ", ", ","), strings.ReplaceAll(r.OnSchema, ", ", ","))
		if attrs != want {
			t.Errorf("%s: %s, want %s", r.Name, attrs, want)
		}
	}
}

// Apply again after a drift (an extra privilege, attribute, membership or
// table grant) restores the definition; and a migration run as the owner
// afterwards keeps the grants. Not parallel: roles are the cluster's, and
// the drift would show in the other tests.
func TestApplyRestoresTheDefinition(t *testing.T) {
	d := newRoled(t)
	admin := d.connect(t, "postgres")
	ctx := context.Background()
	before := map[string]map[string]string{}
	for _, r := range roles.Names() {
		before[r] = privileges(t, admin, r)
	}
	for _, sql := range []string{
		`GRANT TRUNCATE, TRIGGER ON documents TO converge_reader`,
		`GRANT INSERT ON schema_migrations TO converge_writer`,
		`GRANT ALL ON outbox TO PUBLIC`,
		`GRANT CREATE ON SCHEMA public TO converge_writer`,
		`REVOKE SELECT ON chunks FROM converge_writer`,
		`ALTER ROLE converge_relay CREATEDB`,
		`GRANT converge_writer TO converge_relay`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	apply(t, d.adminURL, roles.Options{Database: d.name})
	if _, err := schema.Up(ctx, d.url(t, roles.Owner)); err != nil {
		t.Fatal(err)
	}
	for _, r := range roles.Names() {
		if got := privileges(t, admin, r); !equal(got, before[r]) {
			t.Errorf("%s after apply: %v, want %v", r, got, before[r])
		}
	}
	var createdb bool
	var members int
	if err := admin.QueryRow(ctx, `SELECT rolcreatedb, (SELECT count(*) FROM pg_auth_members WHERE member = r.oid) FROM pg_roles r WHERE rolname = 'converge_relay'`).Scan(&createdb, &members); err != nil || createdb || members != 0 {
		t.Errorf("converge_relay after apply: createdb %v, member of %d roles (%v)", createdb, members, err)
	}
	var canCreate bool
	if err := admin.QueryRow(ctx, `SELECT has_schema_privilege('converge_writer', 'public', 'CREATE')`).Scan(&canCreate); err != nil || canCreate {
		t.Errorf("converge_writer may still create in public: %v %v", canCreate, err)
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Apply creates a missing database (once: the second Apply reports it
// there), and takes over objects a superuser migrated before the roles
// existed: the owner then migrates and the writer writes.
func TestApplyCreatesTheDatabaseAndTakesOverItsObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := pg.NewDatabase(t) // an administrator's connection elsewhere in the cluster
	name := fmt.Sprintf("converge_apply_%d", os.Getpid())
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = conn.Close(context.Background())
		}
	})
	if res := apply(t, base, roles.Options{Database: name}); !res.CreatedDatabase || res.Database != name {
		t.Fatalf("first apply: %+v", res)
	}
	if res := apply(t, base, roles.Options{Database: name}); res.CreatedDatabase || len(res.CreatedRoles) != 0 {
		t.Fatalf("second apply: %+v", res)
	}

	created := &roled{name: name, adminURL: withDatabase(t, base, name)}
	if _, err := created.connect(t, roles.Owner).Exec(ctx, `CREATE TABLE owned (a int); DROP TABLE owned`); err != nil {
		t.Fatalf("the owner in the database apply created: %v", err)
	}

	// A database migrated by the superuser before the roles existed.
	legacyURL := pg.MigratedDatabase(t)
	legacy := &roled{name: databaseOf(t, legacyURL), adminURL: legacyURL}
	apply(t, legacyURL, roles.Options{Database: legacy.name})
	if _, err := schema.Up(ctx, legacy.url(t, roles.Owner)); err != nil {
		t.Fatalf("migrate as %s after taking over: %v", roles.Owner, err)
	}
	if _, err := legacy.connect(t, roles.Writer).Exec(ctx, `INSERT INTO outbox (event_id, key, version, kind, payload) VALUES (gen_random_uuid(), 'k', 1, 'document.upserted', '{}')`); err != nil {
		t.Fatalf("the writer on a database taken over: %v", err)
	}
}

func databaseOf(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func withDatabase(t *testing.T, dbURL, name string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// A password is stored as the verifier Apply computes: with password
// authentication required for a role, the right password logs in and a
// wrong one does not.
func TestPasswordVerifierLogsIn(t *testing.T) {
	ctx := context.Background()
	base := pg.NewDatabase(t)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	const probe = "roles_scram_probe"
	v, err := roles.ScramVerifier("correct horse battery staple", []byte("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+probe+"; CREATE ROLE "+probe+" LOGIN PASSWORD '"+v+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+probe) })
	hba := filepath.Join(pg.Cluster.DataDir(), "pg_hba.conf")
	orig, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	// Only the probe role must authenticate; every other stays trusted.
	if err := os.WriteFile(hba, append([]byte("host all "+probe+" all scram-sha-256\n"), orig...), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(hba, orig, 0o600)
		_, _ = admin.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		password string
		ok       bool
	}{{"correct horse battery staple", true}, {"wrong", false}} {
		u, err := roles.URL(base, probe, c.password)
		if err != nil {
			t.Fatal(err)
		}
		var conn *pgx.Conn
		for range 50 { // the reload is asynchronous
			conn, err = pgx.Connect(ctx, u)
			if c.ok == (err == nil) || c.ok {
				break
			}
		}
		if c.ok != (err == nil) {
			t.Errorf("password %q: connect: %v", c.password, err)
		}
		if conn != nil {
			_ = conn.Close(ctx)
		}
	}
}

// Another application's table in the schema keeps its PUBLIC grants: apply
// and migrate up take back only what concerns converge's objects and roles.
func TestApplyLeavesOtherTablesPublicGrants(t *testing.T) {
	d := newRoled(t)
	admin := d.connect(t, "postgres")
	ctx := context.Background()
	for _, sql := range []string{`CREATE TABLE other_app (x int)`, `GRANT SELECT ON other_app TO PUBLIC`, `GRANT INSERT ON other_app TO converge_writer`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	apply(t, d.adminURL, roles.Options{Database: d.name})
	if _, err := schema.Up(ctx, d.url(t, roles.Owner)); err != nil {
		t.Fatal(err)
	}
	var acl string
	if err := admin.QueryRow(ctx, `SELECT coalesce(relacl::text, '') FROM pg_class WHERE relname = 'other_app'`).Scan(&acl); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(acl, "=r/") {
		t.Errorf("other_app lost its PUBLIC SELECT: acl %q", acl)
	}
	if strings.Contains(acl, "converge_writer=") {
		t.Errorf("converge_writer keeps a privilege on another application's table: acl %q", acl)
	}
}

// A mapped table's view in the schema keeps the writer's SELECT when the
// roles are applied again (which takes back every privilege on the
// schema's tables and views first).
func TestApplyKeepsTheSourceViewsGrant(t *testing.T) {
	d := newRoled(t)
	admin := d.connect(t, "postgres")
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE things (id int PRIMARY KEY, body text)`,
		`CREATE VIEW converge_source_things AS SELECT id AS row_id, body FROM things`,
		`GRANT SELECT ON converge_source_things TO converge_writer`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	apply(t, d.adminURL, roles.Options{Database: d.name})
	var ok, other bool
	if err := admin.QueryRow(ctx, `SELECT has_table_privilege('converge_writer', 'converge_source_things', 'SELECT'),
		has_table_privilege('converge_writer', 'things', 'SELECT')`).Scan(&ok, &other); err != nil {
		t.Fatal(err)
	}
	if !ok || other {
		t.Fatalf("after apply: the writer may read the view %v (want true), the table %v (want false)", ok, other)
	}
}
