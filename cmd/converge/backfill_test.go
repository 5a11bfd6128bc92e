package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// newWriterAPI is the writer's API over a fresh migrated database holding
// n documents (doc-00, doc-01, ...).
func newWriterAPI(t *testing.T, n int) (*httptest.Server, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pg.MigratedDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var writes []docstore.Write
	for i := range n {
		writes = append(writes, docstore.Write{Doc: contract.Document{Key: fmt.Sprintf("doc-%02d", i), Version: int64(i + 1), Body: "body"}})
	}
	if n > 0 {
		if _, err := store.Apply(context.Background(), writes); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(writer.NewAPI(store, writer.APIConfig{}, nil, nil))
	t.Cleanup(srv.Close)
	return srv, pool
}

func TestBackfillFlags(t *testing.T) {
	ctx := context.Background()
	var out bytes.Buffer
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--keys k1,k2,... or re-emit every document with --all"},
		{[]string{"--keys", " , "}, "--keys k1,k2,... or re-emit every document with --all"},
		{[]string{"--keys", "a", "--all"}, "either --keys or --all"},
		{[]string{"--keys", "a", "-after", "a"}, "-after goes with --all"},
		{[]string{"--all", "-limit", "0"}, "-limit must be from 1 to 5000"},
		{[]string{"--all", "-limit", "5001"}, "-limit must be from 1 to 5000"},
		{[]string{"--all", "extra"}, "takes no arguments"},
		{[]string{"--all", "-writer-url", "127.0.0.1:8080"}, "-writer-url must be http://"},
		{[]string{"--all", "-writer-url", "http://127.0.0.1:1"}, "does not answer"},
		{[]string{"--keys", "a", "-writer-url", "http://127.0.0.1:1"}, "does not answer"},
	} {
		err := run(ctx, append([]string{"backfill"}, tc.args...), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("backfill %q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	t.Setenv(envWriterURL, "ftp://x")
	if err := run(ctx, []string{"backfill", "--all"}, &out); err == nil || !strings.Contains(err.Error(), "-writer-url must be") {
		t.Errorf("the writer URL from %s: %v", envWriterURL, err)
	}
}

func TestBackfillThroughTheWriter(t *testing.T) {
	ctx := context.Background()
	srv, pool := newWriterAPI(t, 7)
	var out bytes.Buffer
	if err := run(ctx, []string{"backfill", "--keys", "doc-03, nope,doc-01", "-writer-url", srv.URL}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"re-emitted 2 documents", "doc-01 version 2", "doc-03 version 4", "not found (no such document in Postgres): nope"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := run(ctx, []string{"backfill", "--all", "-limit", "3", "--json", "-writer-url", srv.URL + "/"}, &out); err != nil {
		t.Fatal(err)
	}
	var rep backfillReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(rep.Reemitted) != 7 || rep.Reemitted[6].Key != "doc-06" || rep.Next != "" || len(rep.NotFound) != 0 {
		t.Fatalf("--all report %+v", rep)
	}
	out.Reset()
	if err := run(ctx, []string{"backfill", "--all", "-after", "doc-04", "-writer-url", srv.URL}, &out); err != nil || !strings.Contains(out.String(), "re-emitted 2 documents (every document)") {
		t.Fatalf("--all -after doc-04: %v\n%s", err, out.String())
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE emission > 0`).Scan(&rows); err != nil || rows != 7 {
		t.Fatalf("%d re-emitted outbox rows (%v), want 7", rows, err)
	}

	// A document that cannot be reproduced stops --all with the writer's
	// reason and where to resume.
	if _, err := pool.Exec(ctx, `DELETE FROM chunks WHERE key = 'doc-05'`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := run(ctx, []string{"backfill", "--all", "-limit", "2", "-writer-url", srv.URL}, &out)
	if err == nil || !strings.Contains(err.Error(), "not_reproducible") || !strings.Contains(err.Error(), `"doc-05"`) ||
		!strings.Contains(err.Error(), `-after "doc-03"`) {
		t.Fatalf("--all over an irreproducible document: %v", err)
	}
	if !strings.Contains(out.String(), "re-emitted 4 documents") {
		t.Fatalf("output before the refusal:\n%s", out.String())
	}
}
