package relay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// TestPartsStreamPartitionsAsTheContractSays: the server puts each
// document's events on the subject of contract.Partition, in the order the
// documents' stream holds them, history from before the partitioned stream
// existed included; a change of the number of partitions is refused
// without -repartition, and makes the stream anew with it.
func TestPartsStreamPartitionsAsTheContractSays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := relay.StreamConfig{}
	if _, err := relay.EnsureStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	const keys, versions = 300, 3
	publish := func(v int) {
		for k := range keys {
			key := fmt.Sprintf("doc/%d", k)
			m := nats.NewMsg(contract.Subject(key))
			m.Data = fmt.Appendf(nil, "%s %d", key, v)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(1) // before the partitioned stream exists
	res, err := relay.ApplyPartsStream(ctx, js, cfg, 4, false)
	if err != nil || res != relay.PartsCreated {
		t.Fatalf("apply: %v %v", res, err)
	}
	for v := 2; v <= versions; v++ {
		publish(v)
	}
	check := func(parts int) {
		t.Helper()
		s, err := js.Stream(ctx, contract.PartsStream)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs == keys*versions {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the partitioned stream holds %d messages, want %d", info.State.Msgs, keys*versions)
			}
			time.Sleep(20 * time.Millisecond)
		}
		seen := map[string]int{} // key -> last version
		perPartition := make([]int, parts)
		for p := range parts {
			c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.PartitionSubjectPrefix(p) + ">"}})
			if err != nil {
				t.Fatal(err)
			}
			batch, err := c.FetchNoWait(keys * versions)
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				var key string
				var v int
				if _, err := fmt.Sscanf(string(m.Data()), "%s %d", &key, &v); err != nil {
					t.Fatal(err)
				}
				if want := contract.PartitionSubjectPrefix(contract.Partition(key, parts)) + contract.SubjectToken(key); m.Subject() != want {
					t.Fatalf("%s is on %s, the contract says %s", key, m.Subject(), want)
				}
				if v != seen[key]+1 {
					t.Fatalf("%s: version %d after %d", key, v, seen[key])
				}
				seen[key] = v
				perPartition[p]++
			}
		}
		for k := range keys {
			if key := fmt.Sprintf("doc/%d", k); seen[key] != versions {
				t.Fatalf("%s: %d versions in the partitioned stream, want %d", key, seen[key], versions)
			}
		}
		for p, c := range perPartition {
			if c == 0 {
				t.Fatalf("partition %d of %d holds nothing: %v", p, parts, perPartition)
			}
		}
		t.Logf("%d partitions: %v messages each", parts, perPartition)
	}
	check(4)
	if res, err := relay.ApplyPartsStream(ctx, js, cfg, 4, false); err != nil || res != relay.PartsApplied {
		t.Fatalf("apply again: %v %v", res, err)
	}
	if _, err := relay.ApplyPartsStream(ctx, js, cfg, 8, false); !errors.Is(err, relay.ErrRepartition) {
		t.Fatalf("a change of partitions without -repartition: %v", err)
	}
	if res, err := relay.ApplyPartsStream(ctx, js, cfg, 8, true); err != nil || res != relay.PartsRecreated {
		t.Fatalf("repartition: %v %v", res, err)
	}
	check(8)
}
