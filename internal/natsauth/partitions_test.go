package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// A projector run in every partition a deployment may have: it reads the
// partitioned stream, marks itself partitioned, takes and releases its
// store's lease, announces itself and follows its members, holds each
// partition's lease, consumes, acknowledges and dead-letters with each
// partition's consumer, and, started again, resets each consumer it takes
// over.
func TestPartitionedProjectorDoesItsJob(t *testing.T) {
	for _, name := range []string{"index", "graph"} {
		t.Run(name, func(t *testing.T) { testPartitionedProjectorDoesItsJob(t, name) })
	}
}

func testPartitionedProjectorDoesItsJob(t *testing.T, name string) {
	const parts = contract.MaxPartitions
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := relay.ApplyPartsStream(ctx(t), a.js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	// The one writer of before, which applied three events: the
	// partitions start after them.
	for i := range 3 {
		publishEvent(t, a.js, upsert(t, fmt.Sprintf("applied-%d", i), 1))
	}
	old, err := a.js.CreateOrUpdateConsumer(ctx(t), contract.DocsStream, jetstream.ConsumerConfig{Durable: name,
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := old.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	// An event and an undecodable message in each partition.
	var keys []string
	garbage := map[int]bool{}
	for i := 0; len(keys) < parts || len(garbage) < parts; i++ {
		key := fmt.Sprintf("doc-%d", i)
		if p := contract.Partition(key, parts); len(keys) < parts && !contains(keys, parts, p) {
			publishEvent(t, a.js, upsert(t, key, 1))
			keys = append(keys, key)
		}
		token := fmt.Sprintf("garbage%d", i)
		if p := contract.TokenPartition(token, parts); !garbage[p] {
			if _, err := a.js.Publish(ctx(t), contract.DocsSubjectPrefix+token, []byte("not an event")); err != nil {
				t.Fatal(err)
			}
			garbage[p] = true
		}
	}
	testenv.Eventually(t, "the partitioned stream to copy every message", 10*time.Second, func() bool {
		s, err := a.js.Stream(ctx(t), contract.PartsStream)
		return err == nil && s.CachedInfo().State.Msgs == uint64(3+len(keys)+len(garbage))
	})
	p := e.connect(natsauth.ProjectorUser(name))
	e.record(p.user)
	store := &memStore{versions: map[string]int64{}}
	run := func(what string, until func() bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		sc := projector.ServiceConfig{NATSURL: e.srv.URL, Partitions: parts,
			Runtime: projector.Config{Name: name, LagInterval: 100 * time.Millisecond},
			Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond, Holder: "instance"}}
		go func() {
			done <- projector.RunService(ctx, sc, store, nil, service.Deps{NATS: p.nc, Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
		}()
		testenv.Eventually(t, what, 30*time.Second, until)
		time.Sleep(300 * time.Millisecond) // a lag measurement and a renewal
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run("every partition's event applied and its garbage dead-lettered", func() bool {
		q, err := deadletter.Open(ctx(t), a.js) // the projector creates its stream
		if err != nil || store.len() != parts {
			return false
		}
		for part := range parts {
			if n, err := q.Count(ctx(t), contract.PartitionName(name, part)); err != nil || n != 1 {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		if v := store.version(fmt.Sprintf("applied-%d", i)); v != 0 {
			t.Errorf("applied-%d, which the one writer applied, was handed to the partitions again", i)
		}
	}
	if _, err := a.js.Consumer(ctx(t), contract.DocsStream, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the consumer of the writer without partitions: %v, want it deleted", err)
	}
	kv, err := a.js.KeyValue(ctx(t), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	run("every partition taken again", func() bool {
		for part := range parts {
			if e, err := kv.Get(ctx(t), projector.PartitionLease(name, part)); err != nil || e.Operation() != 0 {
				return false
			}
		}
		return true
	})
	e.used(p)
	p.allowed(t)

	// The operator reads the partitions' status, and replays one.
	o := e.connect(natsauth.UserOperator)
	e.record(o.user)
	if _, err := pipeline.ReadStreams(ctx(t), o.js, contract.PartsStream); err != nil {
		t.Fatal(err)
	}
	run("every partition taken for the status", func() bool {
		cs, err := pipeline.ReadConsumers(ctx(t), o.js, pipeline.ConsumedStream{Stream: contract.PartsStream})
		if err != nil {
			t.Fatal(err)
		}
		held := 0
		for _, c := range cs {
			if c.Holder == "instance" && c.DeadLetters == 1 {
				held++
			}
		}
		return len(cs) == parts && held == parts
	})
	if _, err := projector.Replay(ctx(t), o.js, contract.PartsStream, contract.PartitionName(name, 3), projector.ReplayFrom{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	e.used(o)
	o.allowed(t)
}

func contains(keys []string, parts, p int) bool {
	for _, k := range keys {
		if contract.Partition(k, parts) == p {
			return true
		}
	}
	return false
}

// The index projector neither consumes a partition of the graph
// projector's (nor rebuilds one), nor holds its partitions' leases, nor marks it
// partitioned, nor announces itself among its members, nor watches them.
func TestProjectorHoldsOnlyItsOwnPartitions(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := relay.ApplyPartsStream(ctx(t), a.js, relay.StreamConfig{}, 4, false); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.UserIndex)
	graph3 := contract.PartitionName("graph", 3)
	if _, err := p.js.CreateOrUpdateConsumer(ctx(t), contract.PartsStream, jetstream.ConsumerConfig{
		Durable: graph3, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.PartitionSubjectPrefix(3) + ">"}); err == nil {
		t.Fatal("the index projector created a partition consumer of the graph projector")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.CREATE."+contract.PartsStream+"."+graph3+"."+contract.PartitionSubjectPrefix(3)+">")
	if _, err := p.js.ResetConsumer(ctx(t), contract.PartsStream, graph3); err == nil {
		t.Fatal("the index projector reset a partition consumer of the graph projector")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.RESET."+contract.PartsStream+"."+graph3)
	// Nor the rebuild of one of its partitions.
	graphRebuild := rebuild.ConsumerName("graph")
	if _, err := p.js.CreateOrUpdateConsumer(ctx(t), contract.PartsStream, jetstream.ConsumerConfig{
		Durable: graphRebuild, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.PartitionSubjectPrefix(3) + ">"}); err == nil {
		t.Fatal("the index projector created the graph projector's rebuild consumer on the partitioned stream")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.CREATE."+contract.PartsStream+"."+graphRebuild+"."+contract.PartitionSubjectPrefix(3)+">")
	if err := p.js.DeleteConsumer(ctx(t), contract.PartsStream, graphRebuild); err == nil {
		t.Fatal("the index projector deleted the graph projector's rebuild consumer on the partitioned stream")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.DELETE."+contract.PartsStream+"."+graphRebuild)
	for _, key := range []string{projector.PartitionLease("graph", 3), "graph.partitioned", "graph.members.0123456789abcdef"} {
		if err := p.nc.Publish("$KV."+lease.Bucket+"."+key, []byte(`{"holder":"index"}`)); err != nil {
			t.Fatal(err)
		}
		p.refused(t, "Publish to", "$KV."+lease.Bucket+"."+key)
	}
	if _, err := lease.Open(ctx(t), a.js, lease.Config{Name: "graph"}, nil); err != nil {
		t.Fatal(err)
	}
	kv, err := p.js.KeyValue(ctx(t), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	if w, err := kv.Watch(wctx, "graph.members.*"); err == nil {
		_ = w.Stop()
		t.Fatal("the index projector watches the graph projector's members")
	}
	watch := "$JS.API.CONSUMER.CREATE.KV_" + lease.Bucket + "."
	testenv.Eventually(t, "the refusal of the watch", 5*time.Second, func() bool {
		for _, e := range p.errors() {
			if strings.Contains(e, watch) && strings.Contains(e, ".$KV."+lease.Bucket+".graph.members.*") {
				return true
			}
		}
		return false
	})
	if err := p.nc.Publish(contract.DLQSubject(graph3), []byte("x")); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", contract.DLQSubject(graph3))
}

// The notifier's one writer, run as a service past its lease's TTL, reads
// its partitions' mark.
func TestNotifierReadsItsPartitionsMark(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := relay.EnsureEffectsStream(ctx(t), a.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	n := e.connect(natsauth.UserNotifier)
	sc := projector.ServiceConfig{NATSURL: e.srv.URL,
		Runtime: projector.Config{Name: natsauth.NotifierName, Stream: contract.EventsStream, SubjectPrefix: contract.EventsSubjectPrefix},
		Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond}}
	runCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := projector.RunService(runCtx, sc, &memStore{versions: map[string]int64{}}, nil,
		service.Deps{NATS: n.nc, Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	n.allowed(t)
}

func (s *memStore) version(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[key]
}
