package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
)

func TestStatusReportsSlotOutboxAndStreams(t *testing.T) {
	ctx := context.Background()
	url := pg.MigratedDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('converge_relay', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), `SELECT pg_drop_replication_slot('converge_relay')`) })
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "converge.docs.0123456789abcdef0123456789abcdef", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := run(ctx, []string{"status", "-postgres-url", url, "-nats-url", n.URL, "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if !rep.Slot.Exists || rep.Slot.Active || rep.Slot.ConfirmedLSN == "" {
		t.Fatalf("slot %+v", rep.Slot)
	}
	docs := rep.Streams[0]
	if docs.Name != "CONVERGE_DOCS" || !docs.Exists || docs.Messages != 1 || docs.Subjects != 1 {
		t.Fatalf("stream %+v", docs)
	}
	if rep.Streams[1].Exists {
		t.Fatalf("CONVERGE_INGEST reported as existing: %+v", rep.Streams[1])
	}
	out.Reset()
	if err := run(ctx, []string{"status", "-postgres-url", url, "-nats-url", n.URL}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"converge_relay", "standby/stopped", "CONVERGE_DOCS", "OUTBOX"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, out.String())
		}
	}
}
