package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Partitions: N notifier instances (-partitions N) share the effects, one
// writer per partition. Partition p's events are the work queue
// contract.EventsPartitionStream(p), which the relay fills once the
// operator made the partitions (`converge streams apply -effects
// -effects-partitions N`); its consumer, lease and dead letters are
// <name>-pNN, and its gap detection is the one-writer notifier's, on a
// stream of its own. The dedup store is shared: a document's effects are
// sent by its partition's writer alone.
//
// The move of a running deployment (see package relay): the operator
// makes the partitions; each relay's session ends within a lag check and
// the next one, holding the slot, records the move before it publishes to
// them; then the notifiers start with -partitions N. The first of them
// marks the notifier partitioned and takes the one writer's lease once it
// has stopped (it reads the mark), then finishes the one writer's consumer
// of the effects' stream ([moveToPartitions]) and deletes it, and only
// then does any partition notify: no event is lost, and none is notified
// before an older event of its document. A notifier without partitions
// stops once the partitions exist ([refusePartitions]).

// partitionSource is the notifier's projector.PartitionSource: its
// partitions' work queues; rc is the one writer's runtime configuration.
func partitionSource(n *Notifier, rc projector.Config, window time.Duration, log *slog.Logger) *projector.PartitionSource {
	return &projector.PartitionSource{
		Runtime: func(c projector.Config, p int) projector.Config {
			c = RuntimeConfig(c)
			c.Stream = contract.EventsPartitionStream(p)
			c.SubjectPrefix = contract.EventsPartitionSubjectPrefix(p)
			return c
		},
		Wait: func(ctx context.Context, js jetstream.JetStream, parts int) error {
			return waitForPartitions(ctx, js, parts, window, log)
		},
		Move: func(ctx context.Context, js jetstream.JetStream, term projector.Fencing, writable func() bool) error {
			return moveToPartitions(ctx, js, n, rc, term, writable, log)
		},
	}
}

// waitForPartitions waits until the effects' n partitions exist, saying
// what is missing at once and then every minute; another number of them
// is an error.
func waitForPartitions(ctx context.Context, js jetstream.JetStream, n int, window time.Duration, log *slog.Logger) error {
	var said time.Time
	for {
		missing, err := checkPartitions(ctx, js, n, window, log)
		switch {
		case err != nil:
			return err
		case missing == "":
			return nil
		case time.Since(said) >= time.Minute:
			log.Error("waiting for the effects' partitions: run `converge streams apply -effects -effects-partitions "+strconv.Itoa(n)+"` as the operator",
				"missing", missing)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(StreamWait):
		}
	}
}

// checkPartitions names the first partition's stream that does not exist
// ("" when all do), or fails on a stream that is not one of n partitions.
func checkPartitions(ctx context.Context, js jetstream.JetStream, n int, window time.Duration, log *slog.Logger) (string, error) {
	for p := range n {
		name := contract.EventsPartitionStream(p)
		s, err := js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return name, nil
		case err != nil:
			if ctx.Err() != nil {
				return "", nil
			}
			log.Warn("reading an effects' partition failed; retrying", "stream", name, "err", err)
			return name, nil
		}
		info := s.CachedInfo()
		if have := info.Config.Metadata[contract.MetaPartitions]; have != strconv.Itoa(n) {
			return "", fmt.Errorf("notifier: the effects' partition %s is one of %s partitions, -partitions is %d: give every notifier the partitions' number (or make them anew, empty: converge streams apply -effects -effects-partitions %d -repartition)",
				name, have, n, n)
		}
		if info.Config.Retention != jetstream.WorkQueuePolicy {
			return "", fmt.Errorf("notifier: stream %s has %v retention, not a work queue: it is not an effects' partition", name, info.Config.Retention)
		}
		if age := info.Config.MaxAge; p == 0 && age > 0 && age < window {
			log.Warn("the effects' partitions keep events for less than the notifier's window: an event not notified within its max age leaves them and is reported missed; give the relay -effects-max-age of the window and apply the streams again",
				"stream", name, "max_age", age, "window", window)
		}
	}
	return "", nil
}

// moveToPartitions finishes what the one writer of before left in the
// effects' stream, while this instance holds its lease (term). It waits
// first for the relay's record that it publishes to the partitions
// (contract.EffectsMovedKey): from then on no relay publishes to the
// effects' stream. Then an older deployment's consumer of the documents'
// stream ([Migrate]), then every event of the effects' stream, through n;
// and it deletes the one writer's consumer there.
func moveToPartitions(ctx context.Context, js jetstream.JetStream, n *Notifier, rc projector.Config, term projector.Fencing, writable func() bool, log *slog.Logger) error {
	var said time.Time
	for {
		moved, ok, err := readEffectsMoved(ctx, js)
		if err != nil {
			return err
		}
		if ok {
			log.Info("the relays publish to the effects' partitions", "partitions", moved.Partitions, "since", moved.At)
			break
		}
		if !writable() {
			return lease.ErrLost
		}
		if time.Since(said) >= time.Minute {
			log.Error("waiting for a relay to publish to the effects' partitions: until one holds the slot knowing them, a relay may still publish to the effects' stream, which is notified before any partition; the relays (with -effects) move by themselves within seconds of the partitions' making",
				"stream", contract.EventsStream, "consumer", rc.Name)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(StreamWait):
		}
	}
	s, err := js.Stream(ctx, contract.EventsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("notifier: stream %s: %w", contract.EventsStream, err)
	}
	info := s.CachedInfo()
	if _, err := Migrate(ctx, js, n, rc, info, log); err != nil {
		return err
	}
	_, err = js.Consumer(ctx, contract.EventsStream, rc.Name)
	consumed := err == nil
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("notifier: the consumer %s of %s: %w", rc.Name, contract.EventsStream, err)
	}
	if !consumed && info.State.Msgs == 0 {
		return nil // nothing to hand over
	}
	log.Info("moving to the effects' partitions: finishing the effects' stream first", "stream", contract.EventsStream,
		"consumer", rc.Name, "events", info.State.Msgs)
	dc := rc
	dc.StopWhenCaughtUp = true
	dc.Fence, dc.Bound, dc.Writable = term.Fence, term.Bound, writable
	r, err := projector.New(js, n, dc, nil, log)
	if err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("notifier: finishing the consumer %s of %s: %w", rc.Name, contract.EventsStream, err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !writable() {
		return lease.ErrLost
	}
	if moveStep != nil {
		moveStep("drained")
	}
	// Caught up, with no relay publishing there since the record (a relay
	// of an older version would: upgrade every relay first). Anything
	// pending now is finished before the consumer goes.
	c, err := js.Consumer(ctx, contract.EventsStream, rc.Name)
	if err != nil {
		return fmt.Errorf("notifier: the consumer %s of %s: %w", rc.Name, contract.EventsStream, err)
	}
	if left := c.CachedInfo().NumPending + uint64(c.CachedInfo().NumAckPending); left > 0 {
		return fmt.Errorf("notifier: %d events reached %s after the relay moved to the effects' partitions (a relay of an older version publishes there?): finishing them first", left, contract.EventsStream)
	}
	if err := js.DeleteConsumer(ctx, contract.EventsStream, rc.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("notifier: delete the finished consumer %s of %s: %w", rc.Name, contract.EventsStream, err)
	}
	if moveStep != nil {
		moveStep("deleted")
	}
	// An event stored between the look above and the delete waits in the
	// work queue, which keeps it unread: the move is taken again, and
	// finishes it with a consumer made anew.
	if s, err := js.Stream(ctx, contract.EventsStream); err != nil {
		return fmt.Errorf("notifier: stream %s: %w", contract.EventsStream, err)
	} else if left := s.CachedInfo().State.Msgs; left > 0 {
		return fmt.Errorf("notifier: %d events reached %s as its consumer was deleted (a relay of an older version publishes there?): finishing them first", left, contract.EventsStream)
	}
	log.Info("moved to the effects' partitions: the effects' stream is finished and its consumer deleted", "stream", contract.EventsStream, "consumer", rc.Name)
	return nil
}

// moveStep, set by a test, runs at steps of the move: "drained", once the
// effects' stream is drained and before the move looks for events still
// pending there; "deleted", once its consumer is deleted.
var moveStep func(step string)

// readEffectsMoved reads the relay's record of the move to the effects'
// partitions; false when there is none (or no relay's bucket).
func readEffectsMoved(ctx context.Context, js jetstream.JetStream) (contract.EffectsMoved, bool, error) {
	var m contract.EffectsMoved
	kv, err := js.KeyValue(ctx, contract.RelayBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("notifier: bucket %s: %w", contract.RelayBucket, err)
	}
	found, err := sharedkv.GetJSON(ctx, kv, contract.EffectsMovedKey, &m)
	if err != nil {
		return m, false, fmt.Errorf("notifier: %w", err)
	}
	return m, found, nil
}

// errEffectsPartitioned stops a notifier without partitions once the
// effects have them: the relays publish there, and it would notify
// nothing new.
var errEffectsPartitioned = errors.New("notifier: the effects are in partitions, which this notifier, without -partitions, does not read")

// EffectsPartitionsCheck is how often a notifier without partitions looks
// for the effects' partitions.
var EffectsPartitionsCheck = 30 * time.Second

// refusePartitions runs beside the one writer's runtime: it ends it with
// [errEffectsPartitioned] once the effects' partitions exist, looked for
// at once and then every EffectsPartitionsCheck.
func refusePartitions(ctx context.Context, js jetstream.JetStream) error {
	for {
		s, err := js.Stream(ctx, contract.EventsPartitionStream(0))
		if err == nil {
			n := s.CachedInfo().Config.Metadata[contract.MetaPartitions]
			return fmt.Errorf("%w: start every notifier with -partitions %s (%s); what %s still holds is notified first", errEffectsPartitioned, n, EnvPartitions, contract.EventsStream)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(EffectsPartitionsCheck):
		}
	}
}
