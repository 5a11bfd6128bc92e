package schema_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

// exec runs sql on the database at url.
func exec(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// features names what the migrations after version 1 change, as the
// database at url has it: "emission" (outbox.emission and its sequence,
// version 2), "meta_text" (version 3), "fk" (chunks.key references
// documents, version 1 to 3), "lz4" (outbox payloads compressed with lz4,
// version 5, on a server built with it), "trace" (outbox.trace_context,
// version 6), "xid" (outbox.xid and its index, version 7), "inbox"
// (converge_inbox, version 8), "sources" (converge_mapped_rows and the
// inbox's source rows, version 9).
func features(t *testing.T, url string) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var emission, metaText, fk, lz4, trace, xid, inbox, sources bool
	if err := conn.QueryRow(context.Background(), `SELECT
		EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'outbox' AND column_name = 'emission')
		AND EXISTS (SELECT FROM pg_class WHERE relname = 'outbox_emission_seq' AND relkind = 'S'),
		EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'documents' AND column_name = 'meta_text'),
		EXISTS (SELECT FROM pg_constraint WHERE conname = 'chunks_key_fkey'),
		EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'payload' AND attcompression = 'l'),
		EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'outbox' AND column_name = 'trace_context'),
		EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'outbox' AND column_name = 'xid')
		AND EXISTS (SELECT FROM pg_class WHERE relname = 'outbox_xid' AND relkind = 'i'),
		to_regclass('converge_inbox') IS NOT NULL AND EXISTS (SELECT FROM pg_trigger WHERE tgname = 'converge_inbox_notify'),
		to_regclass('converge_mapped_rows') IS NOT NULL AND EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'converge_inbox' AND column_name = 'row_id')
		AND EXISTS (SELECT FROM pg_proc WHERE proname = 'converge_source_changed')`).Scan(&emission, &metaText, &fk, &lz4, &trace, &xid, &inbox, &sources); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range []struct {
		has  bool
		name string
	}{{emission, "emission"}, {metaText, "meta_text"}, {fk, "fk"}, {lz4, "lz4"}, {trace, "trace"}, {xid, "xid"}, {inbox, "inbox"}, {sources, "sources"}} {
		if f.has {
			out = append(out, f.name)
		}
	}
	return strings.Join(out, " ")
}

// The newest schema is version 9. Each down migration undoes exactly its
// up migration, one step at a time down to version 1, and up again.
func TestMigrationsUpAndDown(t *testing.T) {
	ctx := context.Background()
	url := pg.NewDatabase(t)
	latest, err := schema.LatestVersion()
	if err != nil || latest != 9 {
		t.Fatalf("latest embedded version %d (%v), want 9", latest, err)
	}
	st, err := schema.Up(ctx, url)
	if err != nil || !st.Current() || st.Version != 9 {
		t.Fatalf("up: %+v %v", st, err)
	}
	want := map[uint]string{9: "emission meta_text lz4 trace xid inbox sources", 8: "emission meta_text lz4 trace xid inbox", 7: "emission meta_text lz4 trace xid", 6: "emission meta_text lz4 trace", 5: "emission meta_text lz4", 4: "emission meta_text", 3: "emission meta_text fk", 2: "emission fk", 1: "fk"}
	if !pg.HasLZ4(t) {
		// Version 5 changes nothing on such a server.
		want[5], want[6], want[7], want[8], want[9] = want[4], want[4]+" trace", want[4]+" trace xid", want[4]+" trace xid inbox", want[4]+" trace xid inbox sources"
	}
	if got := features(t, url); got != want[9] {
		t.Fatalf("version 9 has %q, want %q", got, want[9])
	}
	// Version 9's source rows go when it goes: version 8 requires a key
	// and a document.
	exec(t, url, `INSERT INTO converge_inbox (source, row_id) VALUES ('articles', '1')`)
	// Version 4 allows a chunk without its document; going down removes
	// it, or the constraint could not come back.
	exec(t, url, `INSERT INTO chunks (id, key, version, ordinal, text, content_hash)
		VALUES ('00000000-0000-0000-0000-000000000001', 'no-such-document', 1, 0, 'orphan', 'h')`)
	m, err := schema.NewMigrate(url)
	if err != nil {
		t.Fatal(err)
	}
	for v := uint(8); v >= 1; v-- {
		if err := m.Steps(-1); err != nil {
			t.Fatalf("down to version %d: %v", v, err)
		}
		if got, dirty, err := m.Version(); err != nil || got != v || dirty {
			t.Fatalf("after down: version %d dirty %v %v, want %d", got, dirty, err, v)
		}
		if got := features(t, url); got != want[v] {
			t.Fatalf("version %d has %q, want %q", v, got, want[v])
		}
	}
	if _, err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := schema.Inspect(ctx, url); err != nil || st.Current() || st.Version != 1 {
		t.Fatalf("inspect at version 1: %+v %v", st, err)
	}
	if st, err := schema.Up(ctx, url); err != nil || st.Version != 9 || features(t, url) != want[9] {
		t.Fatalf("up again: %+v %v, features %q", st, err, features(t, url))
	}
}

// From PostgreSQL 17 migrate up creates a failover slot, as the relay
// does, so that it survives a promotion; before, the function has no such
// argument. (The servers the tests start are the machine's PostgreSQL 15:
// the version 17 statement is checked for its arguments only.)
func TestSlotIsAFailoverSlotFrom17(t *testing.T) {
	for _, c := range []struct {
		version int
		want    string
	}{
		{150018, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`},
		{169999, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`},
		{170000, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`},
		{180001, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`},
	} {
		if got := schema.CreateSlotSQL(c.version); got != c.want {
			t.Errorf("server %d: %s, want %s", c.version, got, c.want)
		}
	}
	// On this server the statement it picks creates the slot.
	url := pg.NewDatabase(t)
	if _, err := schema.Up(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	created, err := schema.EnsureSlot(context.Background(), url, "failover_check")
	if err != nil || !created {
		t.Fatalf("EnsureSlot: created %v, %v", created, err)
	}
	exec(t, url, `SELECT pg_drop_replication_slot('failover_check')`)
}

// A migration killed halfway (its process SIGKILLed between golang-migrate
// marking the version dirty and marking it clean) leaves all of it or none,
// and a dirty version. Up settles it from what the database holds and goes
// on: no start is refused for it.
func TestUpSettlesADirtyVersion(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		at   uint // the version Up applied before the "kill"
		mark uint // the version marked dirty
	}{
		{"applied, not yet marked clean", 9, 9},
		{"not applied", 8, 9},
		{"idempotent, run again", 4, 5},
		{"the first, not applied", 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := pg.NewDatabase(t)
			if c.at > 0 {
				m, err := schema.NewMigrate(url)
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Migrate(c.at); err != nil {
					t.Fatal(err)
				}
				if _, err := m.Close(); err != nil {
					t.Fatal(err)
				}
				exec(t, url, fmt.Sprintf(`UPDATE schema_migrations SET version = %d, dirty = true`, c.mark))
			} else {
				exec(t, url, fmt.Sprintf(`CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
					INSERT INTO schema_migrations VALUES (%d, true)`, c.mark))
			}
			if st, err := schema.Inspect(ctx, url); err != nil || !st.Dirty {
				t.Fatalf("before: %+v, %v; want dirty", st, err)
			}
			st, err := schema.Up(ctx, url)
			if err != nil || !st.Current() {
				t.Fatalf("up over a dirty version %d: %+v, %v", c.mark, st, err)
			}
			want := "emission meta_text lz4 trace xid inbox sources"
			if !pg.HasLZ4(t) {
				want = "emission meta_text trace xid inbox sources"
			}
			if got := features(t, url); got != want {
				t.Fatalf("after: %q, want %q", got, want)
			}
		})
	}
}

// Every migration says how to tell whether it was applied (or is run
// again), so that a dirty version of it is settled.
func TestEveryMigrationHasACheck(t *testing.T) {
	latest, err := schema.LatestVersion()
	if err != nil {
		t.Fatal(err)
	}
	for v := uint(1); v <= latest; v++ {
		if _, ok := schema.Applied[v]; !ok {
			t.Errorf("migration %d has no entry in schema.applied", v)
		}
	}
}
