package deploy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/testenv"
)

// TestPostgresTakesTheStacksFiles gives a real Postgres the files the
// postgres service runs with: it serves TLS with the certificate and key
// deploy/secrets.sh makes, which a client verifies with sslmode=verify-full
// against the CA, and it parses every line of deploy/postgres/pg_hba.conf
// (a line it cannot parse would stop the stack's server at its start).
func TestPostgresTakesTheStacksFiles(t *testing.T) {
	secrets := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, secrets)
	pg, err := testenv.StartPostgres(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so that it runs after EnableTLS's own cleanup.
	t.Cleanup(pg.Close)
	ca := filepath.Join(secrets, "ca.crt")
	// It returns once a verify-full connection succeeds.
	pg.EnableTLS(t, testenv.Certificates{
		CAFile:   ca,
		CertFile: filepath.Join(secrets, "postgres.crt"),
		KeyFile:  filepath.Join(secrets, "postgres.key"),
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.VerifyFullURL(pg.Cluster.URL("postgres"), ca))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Errorf("the verify-full connection is not TLS (%v)", err)
	}

	// pg_hba_file_rules parses the file on disk when asked; the server
	// goes on with the rules it loaded, since nothing reloads them before
	// the original file is back.
	var hbaFile string
	if err := conn.QueryRow(ctx, "SHOW hba_file").Scan(&hbaFile); err != nil {
		t.Fatal(err)
	}
	original, err := os.ReadFile(hbaFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hbaFile, []byte(readFile(t, "deploy/postgres/pg_hba.conf")), 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(hbaFile, original, 0o600); err != nil {
			t.Error(err)
		}
	}()
	rows, err := conn.Query(ctx, "SELECT line_number, coalesce(error, '') FROM pg_hba_file_rules")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var line int
		var msg string
		if err := rows.Scan(&line, &msg); err != nil {
			t.Fatal(err)
		}
		n++
		if msg != "" {
			t.Errorf("deploy/postgres/pg_hba.conf:%d: %s", line, msg)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := len(readHBA(t, "deploy/postgres/pg_hba.conf")); n != want {
		t.Errorf("Postgres reads %d rules, want %d", n, want)
	}
}
