package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// The effects' partitions: with them, the relay publishes each event for
// effects to the work queue of its document's partition
// (contract.EventsPartitionStream) instead of the effects' stream, so
// that N notifier instances share the effects, one writer per partition.
// The operator makes them (`converge streams apply -effects -partitions
// N`, [ApplyEffectsPartitions]); a relay learns their number from them
// when it first ensures its streams ([EffectsPartitions]), which a
// restart of the relays makes it do.
//
// The move of a running deployment: the first session that publishes to
// the partitions first marks the effects' stream (contract
// .EventsMovedSubject, [MarkEffectsMoved]) when a notifier consumes it or
// it holds events: every event published to it before the mark is older
// than the partitions' first. The partitioned notifier finishes the
// effects' stream's consumer up to the mark before any partition
// notifies, so no event is lost and none overtakes an older one of its
// document. An event published to both (sent before the move, not
// confirmed, published again after it) is one effect, which the dedup
// store sends once.

// ErrEffectsRepartition refuses a change of the effects' number of
// partitions while a partition holds an event the notifier has not
// handled: it would be notified out of order with the events of its
// document in their new partition, or not at all.
var ErrEffectsRepartition = errors.New("relay: changing the number of the effects' partitions while they hold events: stop the relays, let the notifier handle what the partitions hold, then apply again")

// effectsPartStreamConfig is partition p of the effects' stream of cfg
// (defaults applied): its limits, the partition's subjects, and the number
// of partitions in its metadata.
func effectsPartStreamConfig(cfg Config, p int) jetstream.StreamConfig {
	sc := effectsStreamConfig(cfg)
	sc.Name = contract.EventsPartitionStream(p)
	sc.Description = fmt.Sprintf("converge document events for effects, partition %d of %d (the notifier's): every event, kept until acknowledged or MaxAge, published by the relay", p, cfg.Effects.Partitions)
	sc.Subjects = []string{contract.EventsPartitionSubjectPrefix(p) + "*"}
	sc.Metadata = map[string]string{contract.MetaPartitions: strconv.Itoa(cfg.Effects.Partitions)}
	return sc
}

// EffectsPartitions is the number of the effects' partitions the operator
// made: that of their first stream's metadata; 0 when there is none.
func EffectsPartitions(ctx context.Context, js jetstream.JetStream) (int, error) {
	s, err := js.Stream(ctx, contract.EventsPartitionStream(0))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("relay: stream %s: %w", contract.EventsPartitionStream(0), err)
	}
	raw := s.CachedInfo().Config.Metadata[contract.MetaPartitions]
	n, err := strconv.Atoi(raw)
	if err != nil || n < 2 || n > contract.MaxPartitions {
		return 0, fmt.Errorf("relay: stream %s does not say how many partitions the effects have (metadata %s is %q): apply the streams again (%s -effects -partitions N)",
			contract.EventsPartitionStream(0), contract.MetaPartitions, raw, ApplyCommand)
	}
	return n, nil
}

// ensureEffectsPartitions creates each partition's stream that is absent,
// and checks those that exist; the effects' stream itself, when it exists,
// must take the mark of the move.
func ensureEffectsPartitions(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	for p := range cfg.Effects.Partitions {
		if _, err := ensure(ctx, js, effectsPartStreamConfig(cfg, p)); err != nil {
			return err
		}
	}
	s, err := js.Stream(ctx, cfg.Effects.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("relay: stream %s: %w", cfg.Effects.Name, err)
	}
	if diff := streamDifferences(s.CachedInfo().Config, effectsStreamConfig(cfg)); len(diff) > 0 {
		return &StreamSettingsError{Stream: cfg.Effects.Name, Differences: diff}
	}
	return nil
}

// applyEffectsPartitions creates or updates each partition's stream, and
// the effects' stream when it exists (it takes the mark's subject).
func applyEffectsPartitions(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	for p := range cfg.Effects.Partitions {
		want := effectsPartStreamConfig(cfg, p)
		if _, err := js.CreateOrUpdateStream(ctx, want); err != nil {
			return fmt.Errorf("relay: apply stream %s: %w", want.Name, err)
		}
	}
	s, err := js.Stream(ctx, cfg.Effects.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("relay: stream %s: %w", cfg.Effects.Name, err)
	}
	want := effectsStreamConfig(cfg)
	want.Metadata = s.CachedInfo().Config.Metadata
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("relay: update stream %s: %w", want.Name, err)
	}
	return nil
}

// ApplyEffectsPartitions is the operator's step that moves the effects to
// n partitions (2 to contract.MaxPartitions): [ApplyEffectsStream] with
// them. Partitions of another number are refused
// ([ErrEffectsRepartition]) unless repartition is set and every one of
// them is empty: they are then deleted and made anew.
func ApplyEffectsPartitions(ctx context.Context, js jetstream.JetStream, cfg Config, n int, repartition bool) (PartsResult, error) {
	if n < 2 || n > contract.MaxPartitions {
		return "", fmt.Errorf("relay: -partitions %d: partitions are 2 to %d", n, contract.MaxPartitions)
	}
	have, err := EffectsPartitions(ctx, js)
	if err != nil && !repartition {
		return "", err
	}
	res := PartsApplied
	switch {
	case have == 0 && err == nil:
		res = PartsCreated
	case have != n:
		if !repartition {
			return "", fmt.Errorf("%w (they are %d, -partitions %d; -repartition makes them anew once they are empty)", ErrEffectsRepartition, have, n)
		}
		var existing []string
		for p := range contract.MaxPartitions {
			s, err := js.Stream(ctx, contract.EventsPartitionStream(p))
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				continue
			}
			if err != nil {
				return "", fmt.Errorf("relay: stream %s: %w", contract.EventsPartitionStream(p), err)
			}
			if held := s.CachedInfo().State.Msgs; held > 0 {
				return "", fmt.Errorf("%w (%s holds %d)", ErrEffectsRepartition, contract.EventsPartitionStream(p), held)
			}
			existing = append(existing, contract.EventsPartitionStream(p))
		}
		for _, name := range existing {
			if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return "", fmt.Errorf("relay: delete stream %s: %w", name, err)
			}
		}
		res = PartsRecreated
	}
	cfg.Effects.Partitions = n
	if _, err := ApplyEffectsStream(ctx, js, cfg); err != nil {
		return "", err
	}
	return res, nil
}

// MarkEffectsMoved marks the effects' stream, for the notifier's move to
// the partitions, before this relay publishes to them: when a notifier
// consumes the stream or it holds events, and no mark is there yet. A
// stream nobody consumes and that holds nothing needs none.
func MarkEffectsMoved(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) error {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := js.Stream(ctx, cfg.Effects.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("relay: stream %s: %w", cfg.Effects.Name, err)
	}
	info := s.CachedInfo()
	if info.State.Msgs == 0 && info.State.Consumers == 0 {
		return nil
	}
	if !slices.Contains(info.Config.Subjects, contract.EventsMovedSubject) {
		return &StreamSettingsError{Stream: cfg.Effects.Name, Differences: []string{"Subjects lack " + contract.EventsMovedSubject + ", which the move to the effects' partitions needs"}}
	}
	switch m, err := s.GetLastMsgForSubject(ctx, contract.EventsMovedSubject); {
	case err == nil:
		log.Debug("the effects' stream holds the mark of the move to partitions", "seq", m.Sequence)
		return nil
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("relay: reading the mark of the move in %s: %w", cfg.Effects.Name, err)
	}
	ack, err := js.Publish(ctx, contract.EventsMovedSubject, []byte(strconv.Itoa(cfg.Effects.Partitions)))
	if err != nil {
		return fmt.Errorf("relay: marking %s moved to the effects' partitions: %w", cfg.Effects.Name, err)
	}
	log.Warn("the effects move to their partitions: the effects' stream is marked, and the notifier finishes it before any partition notifies",
		"stream", cfg.Effects.Name, "mark_seq", ack.Sequence, "events_before_it", info.State.Msgs, "partitions", cfg.Effects.Partitions)
	return nil
}
