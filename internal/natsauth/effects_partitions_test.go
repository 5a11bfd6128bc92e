package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// The move of the effects to every partition a deployment may have: the
// operator makes the partitions (and makes them anew while they are
// empty), the relay creates those that are missing, records the move in
// its bucket and publishes to them, and the notifier, run in partitions,
// reads that record, finishes the effects' stream, deletes its consumer
// there, consumes, acknowledges and dead-letters with each partition's
// consumer, and, started again, resets each consumer it takes over.
func TestEffectsPartitionsDoTheirJob(t *testing.T) {
	const parts = contract.MaxPartitions
	e := newEnv(t)
	a := e.docsAsAdmin()
	o, r, n := e.connect(natsauth.UserOperator), e.connect(natsauth.UserRelay), e.connect(natsauth.UserNotifier)
	e.record(natsauth.UserOperator, natsauth.UserRelay, natsauth.UserNotifier)
	cfg := relay.Config{Effects: relay.EffectsConfig{Enabled: true}}
	// The deployment of before: an effects' stream, whose one notifier
	// has an event to notify.
	if _, err := relay.ApplyEffectsStream(ctx(t), o.js, cfg); err != nil {
		t.Fatal(err)
	}
	publishEventTo(t, a.js, contract.EventsSubject, upsert(t, "before", 1))
	if _, err := a.js.CreateOrUpdateConsumer(ctx(t), contract.EventsStream, jetstream.ConsumerConfig{Durable: natsauth.NotifierName,
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.EventsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	// The operator: all partitions, made anew as two while empty, then as
	// all again, which are then deleted for the relay to create.
	for _, n := range []int{parts, 2, parts} {
		if _, err := relay.ApplyEffectsPartitions(ctx(t), o.js, cfg, n, true); err != nil {
			t.Fatalf("apply %d effects' partitions: %v", n, err)
		}
	}
	for p := range parts {
		if err := a.js.DeleteStream(ctx(t), contract.EventsPartitionStream(p)); err != nil {
			t.Fatal(err)
		}
	}
	rc := cfg
	rc.Effects.Partitions = parts
	for range 2 { // creates, then finds them as they are
		if _, err := relay.EnsureEffectsStream(ctx(t), r.js, rc); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := relay.EffectsPartitions(ctx(t), r.js); err != nil || got != parts {
		t.Fatalf("the relay reads %d effects' partitions (%v), want %d", got, err, parts)
	}
	// The relay's session, holding the slot, records the move in its
	// bucket.
	pos, err := relay.OpenPositions(ctx(t), r.js, "converge_relay", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := pos.RecordEffectsMoved(ctx(t), parts, "converge_relay"); err != nil {
		t.Fatal(err)
	}
	// An event and an undecodable message in each partition.
	var keys []string
	garbage := map[int]bool{}
	for i := 0; len(keys) < parts || len(garbage) < parts; i++ {
		key := fmt.Sprintf("doc-%d", i)
		if p := contract.Partition(key, parts); len(keys) < parts && !contains(keys, parts, p) {
			publishEventTo(t, r.js, func(k string) string {
				return contract.EventsPartitionSubjectPrefix(p) + contract.SubjectToken(k)
			}, upsert(t, key, 1))
			keys = append(keys, key)
		}
		token := fmt.Sprintf("garbage%d", i)
		if p := contract.TokenPartition(token, parts); !garbage[p] {
			if _, err := r.js.Publish(ctx(t), contract.EventsPartitionSubjectPrefix(p)+token, []byte("not an event")); err != nil {
				t.Fatal(err)
			}
			garbage[p] = true
		}
	}

	var hooks atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hooks.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	run := func(what string, until func() bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		sc := notifier.ServiceConfig{
			Projector: projector.ServiceConfig{NATSURL: e.srv.URL, Partitions: parts,
				Runtime: projector.Config{Name: natsauth.NotifierName, LagInterval: 100 * time.Millisecond},
				Lease:   projector.LeaseConfig{TTL: 600 * time.Millisecond, Holder: "instance"}},
			Notifier: notifier.Config{URLs: []string{hook.URL}, Secret: []byte("secret")},
		}
		go func() {
			done <- notifier.Run(ctx, sc, service.Deps{NATS: n.nc, Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
		}()
		testenv.Eventually(t, what, 30*time.Second, until)
		time.Sleep(300 * time.Millisecond) // a lag measurement and a renewal
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run("every event notified and every partition's garbage dead-lettered", func() bool {
		q, err := deadletter.Open(ctx(t), a.js)
		if err != nil || hooks.Load() != int32(1+parts) {
			return false
		}
		for p := range parts {
			if c, err := q.Count(ctx(t), contract.PartitionName(natsauth.NotifierName, p)); err != nil || c != 1 {
				return false
			}
		}
		return true
	})
	if _, err := a.js.Consumer(ctx(t), contract.EventsStream, natsauth.NotifierName); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the one writer's consumer of the effects' stream: %v, want it deleted", err)
	}
	s, err := a.js.Stream(ctx(t), contract.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := s.CachedInfo().State.Msgs; msgs != 0 {
		t.Errorf("the effects' stream holds %d messages after the move, want none", msgs)
	}
	kv, err := a.js.KeyValue(ctx(t), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	run("every partition taken again", func() bool {
		for p := range parts {
			if e, err := kv.Get(ctx(t), projector.PartitionLease(natsauth.NotifierName, p)); err != nil || e.Operation() != 0 {
				return false
			}
		}
		return true
	})
	if got := hooks.Load(); got != int32(1+parts) {
		t.Errorf("%d webhook requests, want %d", got, 1+parts)
	}
	// The operator reads the partitions' status: each one's consumer,
	// dead letter and holder.
	run("every partition taken for the status", func() bool {
		streams, consumed := pipeline.Deployment(ctx(t), o.js, natsauth.IngestStream, natsauth.IngestDLQName)
		if ss, err := pipeline.ReadStreams(ctx(t), o.js, streams...); err != nil || len(ss) != 5+parts {
			t.Fatalf("the streams' status: %d streams, %v", len(ss), err)
		}
		cs, err := pipeline.ReadConsumers(ctx(t), o.js, consumed...)
		if err != nil {
			t.Fatal(err)
		}
		held := 0
		for _, c := range cs {
			if c.Holder == "instance" && c.DeadLetters == 1 && pipeline.Partitioned(c.Stream) {
				held++
			}
		}
		return held == parts
	})
	e.used(o, r, n)
	o.allowed(t)
	r.allowed(t)
	n.allowed(t)
}

// The relay alone publishes to the effects' partitions and records the
// move to them, and nobody but the operator changes or deletes them: the
// notifier's, a projector's, the writer's and the operator's publishes to
// a partition's subject are refused, so are the notifier's record of the
// move, its update and delete of a partition, its consumer of another
// notifier's partition, and the relay's delete of one.
func TestEffectsPartitionsAreTheRelaysAlone(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	cfg := relay.Config{Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.ApplyEffectsPartitions(ctx(t), a.js, cfg, 2, false); err != nil {
		t.Fatal(err)
	}
	subject := contract.EventsPartitionSubjectPrefix(1) + contract.SubjectToken("doc")
	for _, user := range []string{natsauth.UserNotifier, natsauth.UserIndex, natsauth.UserWriter, natsauth.UserOperator} {
		c := e.connect(user)
		if err := c.nc.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Publish to", subject)
	}
	// Nor may the notifier forge the relay's record of the move.
	n0 := e.connect(natsauth.UserNotifier)
	moved := "$KV." + natsauth.PositionBucket + "." + contract.EffectsMovedKey
	if err := n0.nc.Publish(moved, []byte(`{"partitions":2}`)); err != nil {
		t.Fatal(err)
	}
	n0.refused(t, "Publish to", moved)
	n := e.connect(natsauth.UserNotifier)
	p1 := contract.EventsPartitionStream(1)
	if err := n.js.DeleteStream(ctx(t), p1); err == nil {
		t.Fatal("the notifier deleted an effects' partition")
	}
	n.refused(t, "Publish to", "$JS.API.STREAM.DELETE."+p1)
	if err := n.nc.PublishRequest("$JS.API.STREAM.UPDATE."+p1, n.nc.NewRespInbox(), []byte(`{"name":"`+p1+`","max_age":1000000000}`)); err != nil {
		t.Fatal(err)
	}
	n.refused(t, "Publish to", "$JS.API.STREAM.UPDATE."+p1)
	other := contract.PartitionName("other", 1)
	if _, err := n.js.CreateOrUpdateConsumer(ctx(t), p1, jetstream.ConsumerConfig{Durable: other, AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: contract.EventsPartitionSubjectPrefix(1) + ">"}); err == nil {
		t.Fatal("the notifier created a consumer of another name on an effects' partition")
	}
	n.refused(t, "Publish to", "$JS.API.CONSUMER.CREATE."+p1+"."+other+"."+contract.EventsPartitionSubjectPrefix(1)+">")
	r := e.connect(natsauth.UserRelay)
	if err := r.js.DeleteStream(ctx(t), p1); err == nil {
		t.Fatal("the relay deleted an effects' partition")
	}
	r.refused(t, "Publish to", "$JS.API.STREAM.DELETE."+p1)
	if _, err := a.js.Stream(ctx(t), p1); err != nil {
		t.Fatalf("the partition after the refusals: %v", err)
	}
}
