package schema_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

func hasEmission(t *testing.T, url string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox' AND column_name = 'emission') +
		(SELECT count(*) FROM pg_class WHERE relname = 'outbox_emission_seq' AND relkind = 'S')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 2
}

func hasChunksFK(t *testing.T, url string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_constraint WHERE conname = 'chunks_key_fkey'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func hasMetaText(t *testing.T, url string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.columns WHERE table_name = 'documents' AND column_name = 'meta_text'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// The newest schema is version 4 (chunks without the foreign key of
// version 1; version 3 added documents.meta_text); down three steps goes
// back to version 1 (without re-emission's outbox.emission and its
// sequence), and up again.
func TestMigrationsUpAndDown(t *testing.T) {
	ctx := context.Background()
	url := pg.NewDatabase(t)
	latest, err := schema.LatestVersion()
	if err != nil || latest != 4 {
		t.Fatalf("latest embedded version %d (%v), want 4", latest, err)
	}
	st, err := schema.Up(ctx, url)
	if err != nil || !st.Current() || st.Version != 4 || !hasMetaText(t, url) || hasChunksFK(t, url) {
		t.Fatalf("up: %+v %v", st, err)
	}
	if !hasEmission(t, url) {
		t.Fatal("version 2 lacks outbox.emission or outbox_emission_seq")
	}
	m, err := schema.NewMigrate(url)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Steps(-3); err != nil {
		t.Fatalf("down to version 1: %v", err)
	}
	if v, dirty, err := m.Version(); err != nil || v != 1 || dirty {
		t.Fatalf("after down: version %d dirty %v %v", v, dirty, err)
	}
	if _, err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if hasEmission(t, url) {
		t.Fatal("version 1 still has the re-emission column or sequence")
	}
	if st, err := schema.Inspect(ctx, url); err != nil || st.Current() || st.Version != 1 {
		t.Fatalf("inspect at version 1: %+v %v", st, err)
	}
	if hasMetaText(t, url) || !hasChunksFK(t, url) {
		t.Fatal("version 1 has documents.meta_text, or lacks the chunks' foreign key")
	}
	if st, err := schema.Up(ctx, url); err != nil || st.Version != 4 || !hasEmission(t, url) || !hasMetaText(t, url) || hasChunksFK(t, url) {
		t.Fatalf("up again: %+v %v", st, err)
	}
}
