package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/pkg/contract"
)

// The effects' partitions: with them, the relay publishes each event for
// effects to the work queue of its document's partition
// (contract.EventsPartitionStream) instead of the effects' stream, so
// that N notifier instances share the effects, one writer per partition.
// The operator makes them (`converge streams apply -effects
// -effects-partitions N`, [ApplyEffectsPartitions]); a relay reads their
// number at the start of each session ([EffectsPartitions]), and a
// session that finds it changed while it runs ends, so that the next one
// publishes where the operator said.
//
// The move of a running deployment: once a session of a relay that
// knows the partitions holds the slot, it records so in the relay's
// bucket (contract.EffectsMovedKey) before it publishes anything: no session
// that publishes to the effects' stream can run any more (the slot admits
// one), and every event in the effects' stream was published before. The
// partitioned notifier waits for that record, finishes the effects'
// stream's consumer, deletes it, and only then lets any partition notify,
// so that no event is lost and none is notified before an older one of
// its document. An event published to both (sent before the move, not
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
	s, err := existingStream(ctx, js, contract.EventsPartitionStream(0))
	if s == nil || err != nil {
		return 0, err
	}
	raw := s.CachedInfo().Config.Metadata[contract.MetaPartitions]
	n, err := strconv.Atoi(raw)
	if err != nil || n < 2 || n > contract.MaxPartitions {
		return 0, fmt.Errorf("relay: stream %s does not say how many partitions the effects have (metadata %s is %q): apply the streams again (%s -effects -effects-partitions N)",
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
	s, err := existingStream(ctx, js, cfg.Effects.Name)
	if s == nil || err != nil {
		return err
	}
	if diff := streamDifferences(s.CachedInfo().Config, effectsStreamConfig(cfg)); len(diff) > 0 {
		return &StreamSettingsError{Stream: cfg.Effects.Name, Differences: diff}
	}
	return nil
}

// applyEffectsPartitions creates or updates each partition's stream, and
// the effects' stream when it exists (its limits are the partitions').
func applyEffectsPartitions(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	for p := range cfg.Effects.Partitions {
		want := effectsPartStreamConfig(cfg, p)
		if _, err := js.CreateOrUpdateStream(ctx, want); err != nil {
			return fmt.Errorf("relay: apply stream %s: %w", want.Name, err)
		}
	}
	s, err := existingStream(ctx, js, cfg.Effects.Name)
	if s == nil || err != nil {
		return err
	}
	want := effectsStreamConfig(cfg)
	want.Metadata = s.CachedInfo().Config.Metadata
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("relay: update stream %s: %w", want.Name, err)
	}
	return nil
}

// existingStream is the stream called name; nil (and no error) when it
// does not exist.
func existingStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("relay: stream %s: %w", name, err)
	}
	return s, nil
}

// ApplyEffectsPartitions is the operator's step that moves the effects to
// n partitions (2 to contract.MaxPartitions): [ApplyEffectsStream] with
// them. Partitions of another number are refused
// ([ErrEffectsRepartition]) unless repartition is set and every one of
// them is empty: they are then deleted and made anew.
func ApplyEffectsPartitions(ctx context.Context, js jetstream.JetStream, cfg Config, n int, repartition bool) (PartsResult, error) {
	if n < 2 || n > contract.MaxPartitions {
		return "", fmt.Errorf("relay: -effects-partitions %d: partitions are 2 to %d", n, contract.MaxPartitions)
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
			return "", fmt.Errorf("%w (they are %d, -effects-partitions %d; -repartition makes them anew once they are empty)", ErrEffectsRepartition, have, n)
		}
		var existing []string
		for p := range contract.MaxPartitions {
			s, err := existingStream(ctx, js, contract.EventsPartitionStream(p))
			if err != nil {
				return "", err
			}
			if s == nil {
				continue
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

// RecordEffectsMoved records, once, that a relay holding slot publishes to
// the n effects' partitions (contract.EffectsMovedKey): the session's
// step, once it holds the slot.
func (p *Positions) RecordEffectsMoved(ctx context.Context, n int, slot string) error {
	b, err := json.Marshal(contract.EffectsMoved{Partitions: n, Slot: slot, At: p.clock.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := p.kv.Create(ctx, contract.EffectsMovedKey, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("relay: recording the move to the effects' partitions: %w", err)
	}
	return nil
}

// effectsMoved reads the record of the move to the effects' partitions;
// false when there is none.
func (p *Positions) effectsMoved(ctx context.Context) (contract.EffectsMoved, bool, error) {
	var m contract.EffectsMoved
	found, err := sharedkv.GetJSON(ctx, p.kv, contract.EffectsMovedKey, &m)
	if err != nil {
		return m, false, fmt.Errorf("relay: the record of the move to the effects' partitions: %w", err)
	}
	return m, found, nil
}

// errEffectsGone refuses a session that finds no effects' partitions once
// the move to them was recorded: the notifier no longer reads the
// effects' stream.
var errEffectsGone = errors.New("relay: the effects moved to their partitions")

// errEffectsMoved ends a session whose effects' partitions changed while it
// ran: the next session publishes where the operator now says.
var errEffectsMoved = errors.New("relay: the effects' partitions changed: starting a new session to publish to them")

// watchEffects ends the session (cancel) once the number of the effects'
// partitions differs from the one it publishes with, read every
// LagCheckInterval; a reading that fails is taken again at the next.
func (r *Relay) watchEffects(ctx context.Context, cancel context.CancelCauseFunc) {
	t := time.NewTicker(r.cfg.LagCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, done := context.WithTimeout(ctx, 2*time.Second)
		n, err := EffectsPartitions(rctx, r.js)
		done()
		if known := r.effectsKnown.Load(); err == nil && known >= 0 && int64(n) != known {
			r.log.Info("the effects' partitions changed; starting a new session", "partitions", n, "were", r.effectsKnown.Load())
			cancel(errEffectsMoved)
			return
		}
	}
}
