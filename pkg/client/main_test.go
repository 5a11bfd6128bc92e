package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

var (
	pg *testenv.Postgres
	// writerURL is a real writer, over Postgres, checking bearer tokens:
	// the examples' and the tests' unless they need one of their own.
	writerURL string
)

const (
	// token has the write and admin scopes; readToken only read.
	token     = "sk_client_example_0123456789"
	readToken = "sk_client_reader_0123456789"
	tokens    = "producer write,admin " + token + "\nreader read " + readToken + "\n"
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	p, err := testenv.StartPostgres(nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot start PostgreSQL for tests: %v (run scripts/ensure-postgres.sh)\n", err)
		return 1
	}
	defer p.Close()
	pg = p
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, err := p.MigratedDatabaseForRun(ctx, "client_examples")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	srv, err := newWriter(pool, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Close()
	writerURL = srv.URL
	return m.Run()
}

// newWriter serves the writer's API over pool, through wrap (nil: the
// store as it is), behind mw (nil: none).
func newWriter(pool *pgxpool.Pool, wrap func(writer.Store) writer.Store, mw func(http.Handler) http.Handler) (*httptest.Server, error) {
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		return nil, err
	}
	path, err := os.CreateTemp("", "client-tokens")
	if err != nil {
		return nil, err
	}
	defer os.Remove(path.Name())
	if _, err := path.WriteString(tokens); err != nil {
		return nil, err
	}
	path.Close()
	tk, err := auth.Load(path.Name())
	if err != nil {
		return nil, err
	}
	var s writer.Store = store
	if wrap != nil {
		s = wrap(store)
	}
	var h http.Handler = writer.NewAPI(s, writer.APIConfig{BatchSize: 50, Guard: auth.NewGuard(tk, nil, nil)}, nil, nil)
	if mw != nil {
		h = mw(h)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(&serverErrors, "", 0)
	srv.Start()
	return srv, nil
}

// serverErrors is what the writers' HTTP servers logged: a handler's
// panic, say.
var serverErrors testenv.LockedBuffer
