package roles_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/roles"
)

// What REPLICATION lets the relay do beyond streaming its own slot, as
// PostgreSQL 15 allows it (docs/security.md quotes this test). Over its
// ordinary connection it creates a slot with another output plugin
// (test_decoding, which ignores publications) and reads through it the
// changes of a table it may not SELECT, creates a physical slot, and drops
// slots the superuser made, in its database and in another. It connects
// to another database (PUBLIC's CONNECT there is not converge's to take)
// and creates a slot there. Over its logical replication connection
// (replication=database, the one its stream needs, which pg_hba.conf
// matches by the database's name) it creates logical and physical slots
// and starts a base backup: a copy of the whole cluster; over a physical
// replication connection, a base backup too. If a later
// PostgreSQL refuses one of these, this test fails and the document must
// change with it.
func TestReplicationGrantsMoreThanTheRelaysSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newRoled(t)
	admin := d.connect(t, "postgres")
	relayConn := d.connect(t, roles.Relay)
	for _, sql := range []string{
		`CREATE TABLE not_the_relays (secret text)`,
		`SELECT pg_create_logical_replication_slot('superusers_slot', 'pgoutput')`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	_, err := relayConn.Exec(ctx, `SELECT * FROM not_the_relays`)
	refused(t, "the relay reads a table not granted to it", err, "42501", "permission denied for table not_the_relays")

	allowed := func(what, sql string) {
		t.Helper()
		if _, err := relayConn.Exec(ctx, sql); err != nil {
			t.Errorf("%s: %v; docs/security.md says PostgreSQL 15 allows it", what, err)
			return
		}
		t.Logf("%s: allowed", what)
	}
	allowed("create a slot with test_decoding", `SELECT pg_create_logical_replication_slot('relays_test_decoding', 'test_decoding')`)
	if _, err := admin.Exec(ctx, `INSERT INTO not_the_relays VALUES ('the secret')`); err != nil {
		t.Fatal(err)
	}
	rows, err := relayConn.Query(ctx, `SELECT data FROM pg_logical_slot_get_changes('relays_test_decoding', NULL, NULL)`)
	var changes []string
	if err == nil {
		changes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || !strings.Contains(strings.Join(changes, "\n"), "table public.not_the_relays: INSERT: secret[text]:'the secret'") {
		t.Errorf("the relay decodes a table it may not SELECT: %q %v; docs/security.md says it does", changes, err)
	} else {
		t.Logf("the relay decodes a table it may not SELECT: %q", changes)
	}
	allowed("create a physical slot", `SELECT pg_create_physical_replication_slot('relays_physical', true)`)
	allowed("drop its physical slot", `SELECT pg_drop_replication_slot('relays_physical')`)
	allowed("drop its test_decoding slot", `SELECT pg_drop_replication_slot('relays_test_decoding')`)
	allowed("drop the superuser's slot", `SELECT pg_drop_replication_slot('superusers_slot')`)

	// Another database of the cluster: PUBLIC may connect to it (roles
	// apply takes CONNECT back on converge's database alone), so the
	// relay decodes there too; a slot made there is dropped from here.
	otherDB := pg.Cluster.URL("postgres")
	otherAdmin, err := pgx.Connect(ctx, otherDB)
	if err != nil {
		t.Fatal(err)
	}
	defer otherAdmin.Close(ctx)
	otherSlot := "other_db_" + d.name
	if _, err := otherAdmin.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, otherSlot); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = otherAdmin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, otherSlot)
	}()
	if _, err := relayConn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, otherSlot); err != nil {
		t.Errorf("drop a slot of another database: %v; docs/security.md says PostgreSQL 15 allows it", err)
	}
	relayElsewhere, err := roles.URL(otherDB, roles.Relay, "")
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := pgx.Connect(ctx, relayElsewhere)
	if err != nil {
		t.Fatalf("the relay connects to database postgres: %v; docs/security.md says it may", err)
	}
	defer elsewhere.Close(ctx)
	if _, err := elsewhere.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding', true)`, "relay_in_"+d.name); err != nil {
		t.Errorf("a temporary test_decoding slot in database postgres: %v; docs/security.md says it is allowed", err)
	}

	// Not REPLICATION's: any role writes a logical message into the WAL,
	// which the relay's stream carries (the relay acts on its heartbeat
	// prefix alone).
	if _, err := d.connect(t, roles.Reader).Exec(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, relay.HeartbeatPrefix); err != nil {
		t.Errorf("the reader emits a logical message: %v; docs/security.md says any role may", err)
	}

	walsender, err := pgconn.Connect(ctx, d.url(t, roles.Relay)+"&replication=database")
	if err != nil {
		t.Fatalf("the relay's logical replication connection: %v", err)
	}
	defer walsender.Close(ctx)
	if _, err := pglogrepl.CreateReplicationSlot(ctx, walsender, "relays_walsender_logical", "test_decoding",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, Temporary: true}); err != nil {
		t.Errorf("CREATE_REPLICATION_SLOT ... LOGICAL test_decoding over replication=database: %v; docs/security.md says it is allowed", err)
	}
	if _, err := pglogrepl.CreateReplicationSlot(ctx, walsender, "relays_walsender_physical", "",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.PhysicalReplication, Temporary: true}); err != nil {
		t.Errorf("CREATE_REPLICATION_SLOT ... PHYSICAL over replication=database: %v; docs/security.md says it is allowed", err)
	}
	// A temporary slot is the session's: the base backup below needs a
	// session that holds none.
	backup, err := pgconn.Connect(ctx, d.url(t, roles.Relay)+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer backup.Close(ctx)
	res, err := pglogrepl.StartBaseBackup(ctx, backup, pglogrepl.BaseBackupOptions{Label: "not the relay's", Fast: true})
	if err != nil {
		t.Errorf("BASE_BACKUP over replication=database: %v; docs/security.md says it is allowed", err)
	} else {
		t.Logf("BASE_BACKUP over replication=database: started at %s", res.LSN)
	}

	// A physical replication connection, which the test cluster's
	// pg_hba.conf admits (the lines of roles.HBA refuse it: see
	// TestHBALinesAdmitEachRoleWhereItRuns): a base backup too; a logical
	// slot needs a database.
	physical, err := pgconn.Connect(ctx, d.url(t, roles.Relay)+"&replication=true")
	if err != nil {
		t.Fatalf("the relay's physical replication connection: %v", err)
	}
	defer physical.Close(ctx)
	_, err = pglogrepl.CreateReplicationSlot(ctx, physical, "relays_physical_logical", "test_decoding",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, Temporary: true})
	refused(t, "a logical slot over replication=true", err, pgerrcode.ObjectNotInPrerequisiteState, "logical decoding requires a database connection")
	if _, err := pglogrepl.StartBaseBackup(ctx, physical, pglogrepl.BaseBackupOptions{Label: "not the relay's", Fast: true}); err != nil {
		t.Errorf("BASE_BACKUP over replication=true: %v; docs/security.md says it is allowed", err)
	}
}
