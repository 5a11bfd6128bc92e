package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/jackc/pgx/v5"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) {
	// The demo starts its graph projector as `<this binary> projector-graph`.
	if len(os.Args) > 1 && os.Args[1] == "projector-graph" {
		ctx, stop := service.SignalContext()
		err := service.Command(ctx, "projector-graph", os.Args[2:], graphprojector.ServiceFlags, graphprojector.Run)
		stop()
		service.Exit("projector-graph", err)
	}
	os.Exit(testenv.RunMain(m, &pg))
}

func TestMigrateUpIsIdempotent(t *testing.T) {
	ctx := context.Background()
	url := pg.NewDatabase(t)
	latest, err := schema.LatestVersion()
	if err != nil || latest == 0 {
		t.Fatalf("latest embedded version %d: %v", latest, err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"migrate", "status", "-postgres-url", url}, &out); err == nil {
		t.Fatal("status of an unmigrated database must fail")
	}
	if !strings.Contains(out.String(), "behind") {
		t.Fatalf("status output %q", out.String())
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = c.Exec(context.Background(), `SELECT pg_drop_replication_slot('converge_relay')`)
			_ = c.Close(context.Background())
		}
	})
	for i, want := range []string{"slot converge_relay created", "slot converge_relay exists"} {
		out.Reset()
		if err := run(ctx, []string{"migrate", "up", "-postgres-url", url}, &out); err != nil {
			t.Fatalf("migrate up #%d: %v", i+1, err)
		}
		if !strings.Contains(out.String(), want) {
			t.Fatalf("migrate up #%d said %q, want %q", i+1, out.String(), want)
		}
	}
	out.Reset()
	if err := run(ctx, []string{"migrate", "status", "-postgres-url", url}, &out); err != nil || !strings.Contains(out.String(), "current") {
		t.Fatalf("status after up: %v %q", err, out.String())
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables, pubs int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_tables WHERE tablename IN ('documents','chunks','outbox')),
		(SELECT count(*) FROM pg_publication_tables WHERE pubname = 'converge_outbox' AND tablename = 'outbox')`).Scan(&tables, &pubs); err != nil {
		t.Fatal(err)
	}
	if tables != 3 || pubs != 1 {
		t.Fatalf("tables %d publication tables %d, want 3 and 1", tables, pubs)
	}
	// The publication covers the outbox only.
	var others int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'converge_outbox' AND tablename <> 'outbox'`).Scan(&others); err != nil || others != 0 {
		t.Fatalf("publication covers %d other tables (%v)", others, err)
	}
}

func TestUsageErrors(t *testing.T) {
	ctx := context.Background()
	var out bytes.Buffer
	if err := run(ctx, nil, &out); err != nil || !strings.Contains(out.String(), "migrate up") {
		t.Fatalf("help: %v %q", err, out.String())
	}
	for _, args := range [][]string{{"frobnicate"}, {"migrate"}, {"migrate", "sideways"}} {
		if err := run(ctx, args, &out); err == nil {
			t.Errorf("%v: want an error", args)
		}
	}
	t.Setenv("CONVERGE_POSTGRES_URL", "")
	err := run(ctx, []string{"migrate", "up"}, &out)
	if err == nil || !strings.Contains(err.Error(), "CONVERGE_POSTGRES_URL") {
		t.Fatalf("missing URL: %v", err)
	}
}
