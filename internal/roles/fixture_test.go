package roles_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

// roled is a database prepared as an administrator deploys one: roles
// applied, then migrated as converge_owner.
type roled struct {
	name     string // the database
	adminURL string // the cluster's superuser, connected to it
}

func newRoled(t *testing.T) *roled {
	t.Helper()
	ctx := context.Background()
	adminURL := pg.NewDatabase(t)
	d := &roled{name: databaseOf(t, adminURL), adminURL: adminURL}
	apply(t, adminURL, roles.Options{Database: d.name})
	if _, err := schema.Up(ctx, d.url(t, roles.Owner)); err != nil {
		t.Fatalf("migrate as %s: %v", roles.Owner, err)
	}
	// A slot must go before its database can be dropped.
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), adminURL)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
	})
	return d
}

// apply runs roles.Apply over a connection to adminURL.
func apply(t *testing.T, adminURL string, opts roles.Options) roles.Result {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	res, err := roles.Apply(ctx, conn, opts)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

// url is the database's URL as role (the test cluster trusts loopback, so
// no password).
func (d *roled) url(t *testing.T, role string) string {
	t.Helper()
	u, err := roles.URL(d.adminURL, role, "")
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func (d *roled) connect(t *testing.T, role string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), d.url(t, role))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func (d *roled) pool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), d.url(t, role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// refused asserts that err is Postgres refusing with code and message.
func refused(t *testing.T, what string, err error, code, message string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Errorf("%s: got %v, want SQLSTATE %s %q", what, err, code, message)
		return
	}
	if pgErr.Code != code || pgErr.Message != message {
		t.Errorf("%s: got SQLSTATE %s %q, want %s %q", what, pgErr.Code, pgErr.Message, code, message)
		return
	}
	t.Logf("%s: refused: SQLSTATE %s %s", what, pgErr.Code, pgErr.Message)
}
