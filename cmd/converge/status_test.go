package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
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
	// Two documents handed over and not taken yet, one refused.
	if _, err := conn.Exec(ctx, `INSERT INTO converge_inbox (key, document) VALUES ('a', '{"version": 1}'), ('b', '{"version": 1}');
		INSERT INTO converge_inbox (key, document, refused_at, refused_code, refused_message) VALUES ('c', '{}', now(), 'missing_version', 'version is missing')`); err != nil {
		t.Fatal(err)
	}
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	commit := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	msg := nats.NewMsg("converge.docs.0123456789abcdef0123456789abcdef")
	msg.Data = []byte(`{}`)
	msg.Header.Set(contract.HeaderCommitTime, commit.Format(time.RFC3339Nano))
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	// A projector's consumer that applied the message, with two dead letters.
	cons, err := js.CreateConsumer(ctx, contract.DocsStream, jetstream.ConsumerConfig{Durable: "index", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// The notifier's consumer of the effects' stream, one event pending,
	// with the gap record its runtime keeps in the consumer's metadata.
	if _, err := relay.EnsureEffectsStream(ctx, js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "converge.events.0123456789abcdef0123456789abcdef", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	gapAt := time.Date(2026, 11, 30, 9, 30, 0, 0, time.UTC)
	gap, err := json.Marshal(projector.GapRecord{Missed: 3, LastFrom: 2, LastTo: 4, At: gapAt})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, contract.EventsStream, jetstream.ConsumerConfig{Durable: "notifier", AckPolicy: jetstream.AckExplicitPolicy,
		Metadata: map[string]string{projector.GapRecordKey: string(gap)}}); err != nil {
		t.Fatal(err)
	}
	if err := deadletter.EnsureStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := js.Publish(ctx, contract.DLQSubject("index"), []byte("poison")); err != nil {
			t.Fatal(err)
		}
	}

	// A rebuild of the graph in progress, as its projector keeps it.
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: rebuild.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	if _, err := kv.Put(ctx, "graph", []byte(`{"id":"r1","phase":"filling","target":"graph-20261130T100000Z","previous":"graph","started_at":"`+started.Format(time.RFC3339)+`"}`)); err != nil {
		t.Fatal(err)
	}
	// And of one partition of the index.
	if _, err := kv.Put(ctx, "index", []byte(`{"id":"r2","phase":"wiping","in_place":true,"target":"converge_chunks_1","previous":"converge_chunks_1","partition":2,"partitions":4,"started_at":"`+started.Format(time.RFC3339)+`"}`)); err != nil {
		t.Fatal(err)
	}

	rep, err := statusJSON(ctx, url, n.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Slot.Exists || rep.Slot.Active || rep.Slot.ConfirmedLSN == "" {
		t.Fatalf("slot %+v", rep.Slot)
	}
	docs := rep.Streams[0]
	if docs.Name != contract.DocsStream || !docs.Exists || docs.Messages != 1 || docs.Subjects != 1 {
		t.Fatalf("stream %+v", docs)
	}
	if ev := rep.Streams[1]; ev.Name != contract.EventsStream || !ev.Exists || ev.Messages != 1 {
		t.Fatalf("stream %+v, want the effects' stream with one event", ev)
	}
	if rep.Streams[2].Exists {
		t.Fatalf("CONVERGE_INGEST reported as existing: %+v", rep.Streams[2])
	}
	if len(rep.Consumers) != 2 || rep.Consumers[0].Name != "index" || rep.Consumers[1].Name != "notifier" {
		t.Fatalf("consumers %+v, want the index projector's and the notifier's", rep.Consumers)
	}
	if nc := rep.Consumers[1]; nc.Stream != contract.EventsStream || nc.Pending != 1 || nc.Missed != 3 || nc.LastGap == nil || nc.LastGap.LastFrom != 2 || nc.LastGap.LastTo != 4 || !nc.LastGap.At.Equal(gapAt) {
		t.Fatalf("notifier consumer %+v (last gap %+v), want 3 missed, last 2..4", nc, nc.LastGap)
	}
	if rep.Inbox.Pending != 2 || rep.Inbox.Refused != 1 || rep.Inbox.OldestPending == nil {
		t.Fatalf("inbox %+v, want 2 pending and 1 refused", rep.Inbox)
	}
	c := rep.Consumers[0]
	if c.Missed != 0 || c.LastGap != nil {
		t.Fatalf("index consumer reports a gap: %+v", c.LastGap)
	}
	if c.Name != "index" || c.Stream != contract.DocsStream || c.Pending != 0 || c.AckPending != 0 || c.AckFloorSeq != 1 ||
		c.DeadLetters != 2 || c.LastApplied == nil || !c.LastApplied.Equal(commit) {
		t.Fatalf("consumer %+v (last applied %v), want index caught up at seq 1, 2 dead letters, last applied %v", c, c.LastApplied, commit)
	}
	slices.SortFunc(rep.Rebuilds, func(a, b rebuild.State) int { return strings.Compare(a.Projector, b.Projector) })
	if len(rep.Rebuilds) != 2 || rep.Rebuilds[0].Projector != "graph" || rep.Rebuilds[0].Phase != rebuild.PhaseFilling ||
		rep.Rebuilds[0].Target != "graph-20261130T100000Z" || !rep.Rebuilds[0].StartedAt.Equal(started) || rep.Rebuilds[0].Partition != nil {
		t.Fatalf("rebuilds %+v, want the graph's in progress", rep.Rebuilds)
	}
	if ix := rep.Rebuilds[1]; ix.Projector != "index" || ix.Partition == nil || *ix.Partition != 2 || ix.Partitions != 4 {
		t.Fatalf("rebuilds %+v, want the index's of partition 2 of 4 in progress", rep.Rebuilds)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"status", "-postgres-url", url, "-nats-url", n.URL}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"converge_relay", "standby/stopped", contract.DocsStream, contract.EventsStream, "OUTBOX", "INBOX", "2 pending", "1 refused", "CONSUMER", "index",
		"REBUILD", "graph-20261130T100000Z", "converge_chunks_1 (partition 2 of 4, in place)", "MISSED", "3 (last 2..4 at 2026-11-30T09:30:00Z)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// A partition whose lease a reader sees unchanged for its whole TTL is
// shown with its holder as not renewed; one renewed is shown as held.
// Neither verdict reads the holders' wall clocks: the live holder's runs
// an hour behind, the crashed one's an hour ahead.
func TestStatusTellsAPartitionHolderThatStoppedRenewing(t *testing.T) {
	ctx := context.Background()
	url := pg.MigratedDatabase(t)
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ApplyPartsStream(ctx, js, relay.StreamConfig{}, 2, false); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"index-p00", "index-p01"} {
		if _, err := js.CreateConsumer(ctx, contract.PartsStream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = 600 * time.Millisecond
	l, err := lease.Open(ctx, js, lease.Config{Name: projector.PartitionLease("index", 0), Holder: "live", TTL: ttl, Clock: clock.NewShifted(-time.Hour)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	term, err := l.Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(term.Release)
	// The crashed holder's last renewal, written once.
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().UTC().Add(time.Hour)
	last, err := json.Marshal(lease.Value{Holder: "crashed", Since: ahead, Renewed: ahead, TTLms: ttl.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, projector.PartitionLease("index", 1), last); err != nil {
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
	held := map[string]pipeline.ConsumerStatus{}
	for _, c := range rep.Consumers {
		held[c.Name] = c
	}
	if c := held["index-p00"]; c.Holder != "live" || c.HolderNotRenewedMs != 0 {
		t.Fatalf("partition 0: %+v, want held by live, renewed", c)
	}
	if c := held["index-p01"]; c.Holder != "crashed" || c.HolderNotRenewedMs < ttl.Milliseconds() {
		t.Fatalf("partition 1: %+v, want held by crashed, not renewed for %v or more", c, ttl)
	}
	if !strings.Contains(out.String(), `"holder_not_renewed_ms":`) {
		t.Fatalf("the JSON lacks holder_not_renewed_ms: %s", out.String())
	}

	out.Reset()
	if err := run(ctx, []string{"status", "-postgres-url", url, "-nats-url", n.URL}, &out); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for line := range strings.Lines(out.String()) {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "index-p") {
			lines[f[0]+" "+f[1]] = strings.TrimSpace(line)
		}
	}
	if got := lines["index-p00 live"]; got == "" || strings.Contains(got, "not renewed") {
		t.Fatalf("partition 0 shown as %q, want held by live:\n%s", got, out.String())
	}
	if got := lines["index-p01 crashed"]; !strings.Contains(got, "crashed (not renewed for ") || !strings.Contains(got, "expired or cut off") {
		t.Fatalf("partition 1 shown as %q, want crashed, not renewed:\n%s", got, out.String())
	}
}
