package projector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// countingStore counts the events it was handed, applied or skipped.
type countingStore struct {
	mu      sync.Mutex
	handed  int
	version map[string]int64
}

func (s *countingStore) Apply(_ context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.version == nil {
		s.version = map[string]int64{}
	}
	res := make([]projector.Result, len(events))
	for i, ev := range events {
		s.handed++
		if s.version[ev.Key] >= ev.Version {
			res[i].Outcome = projector.Skipped
			continue
		}
		s.version[ev.Key] = ev.Version
	}
	return res
}

func (s *countingStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handed
}

func consumerConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.ConsumerConfig {
	t.Helper()
	c, err := js.Consumer(context.Background(), contract.DocsStream, name)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo().Config
}

// The replayed consumer is the projector's own, started at the sequence:
// its next run receives every event from there again, and keeps that start.
func TestReplayFromSequence(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	for k := range 10 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	cfg := projector.Config{Name: "replayed", AckWait: 7 * time.Second, BatchSize: 8}
	store := &countingStore{}
	run(t, e, store, cfg, nil)
	if store.count() != 10 {
		t.Fatalf("the first run handed the store %d events, want 10", store.count())
	}
	before := consumerConfig(t, e.js, "replayed")

	pending, err := projector.Replay(ctx, e.js, contract.DocsStream, "replayed", projector.ReplayFrom{Seq: 4})
	if err != nil {
		t.Fatal(err)
	}
	if pending != 7 {
		t.Fatalf("%d pending after a replay from sequence 4 of 10, want 7", pending)
	}
	after := consumerConfig(t, e.js, "replayed")
	if after.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || after.OptStartSeq != 4 || after.OptStartTime != nil {
		t.Fatalf("the replayed consumer starts by %v at %d / %v, want sequence 4", after.DeliverPolicy, after.OptStartSeq, after.OptStartTime)
	}
	// Everything but the start is what the runtime made.
	if after.Durable != before.Durable || after.Description != before.Description || after.AckPolicy != jetstream.AckExplicitPolicy ||
		after.AckWait != 7*time.Second || after.MaxAckPending != 32 || after.FilterSubject != contract.DocsSubjectPrefix+">" ||
		after.MaxDeliver != before.MaxDeliver {
		t.Fatalf("the replayed consumer is %+v, want the projector's %+v with another start", after, before)
	}

	again := &countingStore{}
	run(t, e, again, cfg, nil)
	if again.count() != 7 {
		t.Fatalf("the run after the replay handed the store %d events, want the 7 from sequence 4", again.count())
	}
	if kept := consumerConfig(t, e.js, "replayed"); kept.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || kept.OptStartSeq != 4 {
		t.Fatalf("the projector changed the replayed start to %v at %d", kept.DeliverPolicy, kept.OptStartSeq)
	}
}

// A replay from a time delivers the messages stored from then on.
func TestReplayFromTime(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	for k := range 5 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	time.Sleep(20 * time.Millisecond)
	from := time.Now()
	time.Sleep(20 * time.Millisecond)
	for k := range 3 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 2))
	}
	cfg := projector.Config{Name: "timed"}
	run(t, e, &countingStore{}, cfg, nil)
	pending, err := projector.Replay(ctx, e.js, contract.DocsStream, "timed", projector.ReplayFrom{Time: from})
	if err != nil {
		t.Fatal(err)
	}
	if pending != 3 {
		t.Fatalf("%d pending after a replay from between the writes, want the 3 later ones", pending)
	}
	c := consumerConfig(t, e.js, "timed")
	if c.DeliverPolicy != jetstream.DeliverByStartTimePolicy || c.OptStartTime == nil || !c.OptStartTime.Equal(from) || c.OptStartSeq != 0 {
		t.Fatalf("the replayed consumer starts by %v at %d / %v, want the time %v", c.DeliverPolicy, c.OptStartSeq, c.OptStartTime, from)
	}
	store := &countingStore{}
	run(t, e, store, cfg, nil)
	if store.count() != 3 {
		t.Fatalf("the run after the replay handed the store %d events, want 3", store.count())
	}
}

// A running projector whose consumer is replayed receives every event
// again without a restart.
func TestReplayWhileTheProjectorRuns(t *testing.T) {
	e := newEnv(t)
	for k := range 20 {
		e.publish(t, upsert(fmt.Sprintf("doc-%d", k), 1))
	}
	store := &countingStore{}
	r, err := projector.New(e.js, store, projector.Config{Name: "live"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	testenv.Eventually(t, "the projector to apply the 20 events", 30*time.Second, func() bool { return store.count() == 20 })
	if _, err := projector.Replay(ctx, e.js, contract.DocsStream, "live", projector.ReplayFrom{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the running projector to receive the 20 events again", 30*time.Second, func() bool { return store.count() >= 40 })
}

// A consumer that does not exist, or a start that is not one, changes
// nothing.
func TestReplayRefuses(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.publish(t, upsert("doc", 1))
	_, err := projector.Replay(ctx, e.js, contract.DocsStream, "nobody", projector.ReplayFrom{Seq: 1})
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("a replay of a missing consumer: %v, want ErrConsumerNotFound", err)
	}
	if _, err := e.js.Consumer(ctx, contract.DocsStream, "nobody"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the refused replay created the consumer: %v", err)
	}
	run(t, e, &countingStore{}, projector.Config{Name: "kept"}, nil)
	for _, from := range []projector.ReplayFrom{{}, {Seq: 1, Time: time.Now()}} {
		if _, err := projector.Replay(ctx, e.js, contract.DocsStream, "kept", from); err == nil {
			t.Errorf("a replay from %+v succeeded", from)
		}
	}
	if c := consumerConfig(t, e.js, "kept"); c.DeliverPolicy != jetstream.DeliverAllPolicy {
		t.Fatalf("a refused replay changed the consumer's start to %v", c.DeliverPolicy)
	}
}
