package verify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// A projector run in partitions has passed a sequence of the documents'
// stream once the partitioned stream has copied that far and every
// partition's consumer acknowledged its messages up to there; not while
// one partition lags, nor before the copy. Without partitions it says so.
func TestPartitionThresholds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _, err := verify.PartitionThresholds(ctx, js, "index", 1); ok || err != nil {
		t.Fatalf("without a partitioned stream: ok %v, %v", ok, err)
	}
	const parts = 4
	if _, err := relay.ApplyPartsStream(ctx, js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	publish := func(keys int) uint64 {
		var last uint64
		for k := range keys {
			m := nats.NewMsg(contract.Subject(fmt.Sprintf("doc-%d-%d", k, time.Now().UnixNano())))
			m.Data = []byte("x")
			ack, err := js.PublishMsg(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			last = ack.Sequence
		}
		return last
	}
	seq := publish(40)
	consumers := make([]jetstream.Consumer, parts)
	for p := range parts {
		c, err := js.CreateOrUpdateConsumer(ctx, contract.PartsStream, jetstream.ConsumerConfig{Durable: contract.PartitionName("index", p),
			AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.PartitionSubjectPrefix(p) + ">"})
		if err != nil {
			t.Fatal(err)
		}
		consumers[p] = c
	}
	var th verify.Thresholds
	thresholds := func() {
		t.Helper()
		testenv.Eventually(t, "the partitioned stream to copy that far", 10*time.Second, func() bool {
			got, isParts, ready, err := verify.PartitionThresholds(ctx, js, "index", seq)
			if err != nil || !isParts {
				t.Fatalf("partitioned: %v, %v", isParts, err)
			}
			th = got
			return ready
		})
	}
	passed := func() bool {
		t.Helper()
		ok, err := verify.PartitionsAcknowledged(ctx, js, "index", th)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	ackAll := func(p int) {
		t.Helper()
		batch, err := consumers[p].FetchNoWait(1000)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, ready, err := verify.PartitionThresholds(ctx, js, "index", seq+1); ready || err != nil {
		t.Fatalf("thresholds of a sequence not yet in the documents' stream: ready %v, %v", ready, err)
	}
	thresholds()
	if passed() {
		t.Fatal("passed with nothing acknowledged")
	}
	for p := range parts - 1 {
		ackAll(p)
	}
	if passed() {
		t.Fatal("passed with one partition's messages unacknowledged")
	}
	ackAll(parts - 1)
	if !passed() {
		t.Fatal("not passed with every partition's messages acknowledged")
	}
	// Later messages: still passed at seq, not at their own last sequence
	// until acknowledged.
	later := publish(20)
	if !passed() {
		t.Fatal("an earlier sequence is no longer passed once later messages arrive")
	}
	seq = later
	thresholds()
	if passed() {
		t.Fatal("passed a later sequence with its messages unacknowledged")
	}
	for p := range parts {
		ackAll(p)
	}
	if !passed() {
		t.Fatal("not passed once every later message is acknowledged")
	}
}
