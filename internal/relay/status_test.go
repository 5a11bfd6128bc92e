package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// The slot and the outbox as a relay leaves them: missing before its
// first start, active while it runs, stopped after; the outbox's rows
// whatever the relay did with them.
func TestReadSlotAndOutbox(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	slot, err := pipeline.ReadSlot(ctx, f.pool, "converge_relay")
	if err != nil {
		t.Fatal(err)
	}
	if slot.Name != "converge_relay" || slot.Exists || slot.Active || slot.ConfirmedLSN != "" {
		t.Fatalf("the slot before the relay's first start: %+v", slot)
	}
	outbox, err := pipeline.ReadOutbox(ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if outbox.Rows != 0 || outbox.Oldest != nil {
		t.Fatalf("the empty outbox: %+v", outbox)
	}
	f.write(t, 0, 30, 1)
	outbox, err = pipeline.ReadOutbox(ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if outbox.Rows != 30 || outbox.Oldest == nil || time.Since(*outbox.Oldest) > time.Minute {
		t.Fatalf("the outbox after 30 writes: %+v", outbox)
	}

	stop := f.startRelay(t, relay.Config{})
	f.waitSlot(t)
	f.write(t, 0, 10, 2)
	// The 30 written before the slot existed too, from the outbox.
	testenv.Eventually(t, "40 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 40 })
	slot, err = pipeline.ReadSlot(ctx, f.pool, "converge_relay")
	if err != nil {
		t.Fatal(err)
	}
	if !slot.Exists || !slot.Active || slot.ActivePID == nil || slot.ConfirmedLSN == "" || slot.WALStatus == "" || slot.LagBytes < 0 {
		t.Fatalf("the slot of a running relay: %+v", slot)
	}
	stop()
	testenv.Eventually(t, "the slot to be inactive", 10*time.Second, func() bool {
		s, err := pipeline.ReadSlot(ctx, f.pool, "converge_relay")
		return err == nil && s.Exists && !s.Active && s.ActivePID == nil
	})
}

// Streams are reported in the order asked, a missing one as such; the
// consumers of each stream with their progress and their dead letters,
// under their own name or the stream's.
func TestReadStreamsAndConsumers(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.StartNATS(t).DocsStream(t)
	commits := make([]time.Time, 6)
	for i := range commits {
		commits[i] = time.Date(2026, 11, 30, 9, 0, i, 0, time.UTC)
		msg := nats.NewMsg(contract.Subject(fmt.Sprintf("doc-%d", i)))
		msg.Data = []byte(`{}`)
		msg.Header.Set(contract.HeaderCommitTime, commits[i].Format(time.RFC3339Nano))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TEST_INGEST", Subjects: []string{"test.ingest.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "TEST_INGEST", jetstream.ConsumerConfig{Durable: "ingester", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	// A projector's consumer that applied the first four messages, in order.
	cons, err := js.CreateConsumer(ctx, contract.DocsStream, jetstream.ConsumerConfig{Durable: "index", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("fetched %d messages, want 4", n)
	}
	if err := deadletter.EnsureStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"index", "index", "ingest", "ingest", "ingest", "ingester"} {
		if _, err := js.Publish(ctx, contract.DLQSubject(name), []byte("poison")); err != nil {
			t.Fatal(err)
		}
	}

	streams, err := pipeline.ReadStreams(ctx, js, contract.DocsStream, "MISSING", deadletter.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(streams) != 3 {
		t.Fatalf("streams %+v, want 3", streams)
	}
	if s := streams[0]; s.Name != contract.DocsStream || !s.Exists || s.Messages != 6 || s.Subjects != 6 || s.FirstSeq != 1 || s.LastSeq != 6 ||
		s.Consumers != 1 || s.Bytes == 0 || s.LastTime.IsZero() {
		t.Fatalf("the documents stream: %+v", s)
	}
	if s := streams[1]; s.Name != "MISSING" || s.Exists || s.Messages != 0 {
		t.Fatalf("a missing stream: %+v", s)
	}
	if s := streams[2]; s.Name != deadletter.Stream || !s.Exists || s.Messages != 6 {
		t.Fatalf("the dead-letter stream: %+v", s)
	}

	consumers, err := pipeline.ReadConsumers(ctx, js, pipeline.ConsumedStream{Stream: contract.DocsStream},
		pipeline.ConsumedStream{Stream: "MISSING"}, pipeline.ConsumedStream{Stream: "TEST_INGEST", DeadLetters: "ingest"})
	if err != nil {
		t.Fatal(err)
	}
	if len(consumers) != 2 {
		t.Fatalf("consumers %+v, want index and ingester", consumers)
	}
	c := consumers[0]
	if c.Stream != contract.DocsStream || c.Name != "index" || c.Pending != 2 || c.AckPending != 0 || c.AckFloorSeq != 4 ||
		c.DeadLetters != 2 || c.LastApplied == nil || !c.LastApplied.Equal(commits[3]) {
		t.Fatalf("the index's consumer %+v (last applied %v), want 2 pending, acknowledged to 4 (committed %v), 2 dead letters", c, c.LastApplied, commits[3])
	}
	if c := consumers[1]; c.Stream != "TEST_INGEST" || c.Name != "ingester" || c.DeadLetters != 3 || c.LastApplied != nil || c.AckFloorSeq != 0 {
		t.Fatalf("the ingest consumer %+v, want the 3 dead letters of its stream's name and nothing applied", c)
	}
}
