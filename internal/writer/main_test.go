package writer_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

// env is one writer over a fresh migrated database.
type env struct {
	pool    *pgxpool.Pool
	store   *docstore.Store
	metrics *writer.Metrics
	srv     *httptest.Server
}

func newEnv(t testing.TB) *env {
	t.Helper()
	url := pg.MigratedDatabase(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics := writer.NewMetrics(nil)
	srv := httptest.NewServer(writer.NewAPI(store, writer.APIConfig{BatchSize: 100}, metrics, nil))
	t.Cleanup(srv.Close)
	return &env{pool: pool, store: store, metrics: metrics, srv: srv}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func pgxCount(url string, n *int) error {
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), `SELECT count(*) FROM documents`).Scan(n)
}
