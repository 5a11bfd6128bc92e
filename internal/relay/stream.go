package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// The relay creates its streams when they do not exist (the documents'
// stream; with effects, the effects' stream and the removals' stream that
// records what the effects' stream's limits took from a consumer), and
// never changes them: an update could shrink a limit (MaxMsgsPerSubject 1, a
// MaxAge of a second), which removes what the projectors and the notifier
// have not read as surely as a purge, and NATS gives the relay no right to
// it. The operator changes them, with [ApplyStream] and
// [ApplyEffectsStream] (`converge streams apply`). A relay that finds a
// stream unlike its configuration does not publish; its error
// ([*StreamSettingsError]) names each setting and that command.

// ApplyCommand is the operator's command that creates or updates the
// streams to the settings the relay is given.
const ApplyCommand = "converge streams apply"

// StreamSettingsError is a stream that exists with settings other than the
// relay's configuration.
type StreamSettingsError struct {
	Stream string
	// Differences name each setting: "MaxAge 1s, configured 0s".
	Differences []string
}

func (e *StreamSettingsError) Error() string {
	return fmt.Sprintf("relay: stream %s differs from the relay's configuration (%s); the relay never changes a stream: run `%s` as the operator with the relay's stream settings, or give the relay the stream's",
		e.Stream, strings.Join(e.Differences, "; "), ApplyCommand)
}

// docsStreamConfig is the documents' stream of cfg (defaults applied).
func docsStreamConfig(cfg StreamConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              cfg.Name,
		Description:       "converge document events, one subject per document, published by the relay",
		Subjects:          []string{contract.DocsSubjectPrefix + ">"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
		Duplicates:        cfg.Duplicates,
		MaxMsgsPerSubject: cfg.MaxMsgsPerSubject,
		MaxAge:            cfg.MaxAge,
		MaxMsgSize:        contract.MaxMessageBytes,
		AllowDirect:       true,
	}
}

// effectsStreamConfig is the effects' stream of cfg (defaults applied),
// without its metadata.
func effectsStreamConfig(cfg Config) jetstream.StreamConfig {
	e := cfg.Effects
	sc := jetstream.StreamConfig{
		Name:        e.Name,
		Description: "converge document events for effects (the notifier): every event, kept until acknowledged or MaxAge, published by the relay",
		Subjects:    []string{contract.EventsSubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     cfg.Stream.Storage,
		Replicas:    e.Replicas,
		Duplicates:  cfg.Stream.Duplicates,
		MaxAge:      e.MaxAge,
		MaxBytes:    e.MaxBytes,
		MaxMsgSize:  contract.MaxMessageBytes,
	}
	return sc
}

// RemovalsMaxAge and RemovalsMaxMsgs bound the removals' stream
// (contract.RemovalsStream): a record stays until the notifier read it,
// within a month and a million records, far beyond a notifier's outage.
const (
	RemovalsMaxAge  = 30 * 24 * time.Hour
	RemovalsMaxMsgs = 1_000_000
)

// removalsStreamConfig is the removals' stream of cfg (defaults applied):
// the server's advisories of the effects' stream's events removed while
// delivered and unacknowledged, and of its partitions' when it has them.
func removalsStreamConfig(cfg Config) jetstream.StreamConfig {
	subjects := []string{contract.RemovalsSubject(cfg.Effects.Name, "*")}
	for p := range cfg.Effects.Partitions {
		subjects = append(subjects, contract.RemovalsSubject(contract.EventsPartitionStream(p), "*"))
	}
	return jetstream.StreamConfig{
		Name:        contract.RemovalsStream,
		Description: "the server's record of each event of " + cfg.Effects.Name + " (and of its partitions) its limits removed while a consumer held it unacknowledged, read by the notifier",
		Subjects:    subjects,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     cfg.Stream.Storage,
		Replicas:    cfg.Effects.Replicas,
		MaxAge:      RemovalsMaxAge,
		MaxMsgs:     RemovalsMaxMsgs,
	}
}

// EnsureStream creates the documents' stream, or checks that the existing
// one has cfg's settings (a [*StreamSettingsError] when not).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg.setDefaults()
	return ensure(ctx, js, docsStreamConfig(cfg))
}

// ApplyStream creates the documents' stream or updates it to cfg: the
// operator's step, which the relay may not take.
func ApplyStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg.setDefaults()
	want := docsStreamConfig(cfg)
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("relay: apply stream %s: %w", want.Name, err)
	}
	return s, nil
}

// ensure creates want, or reads the existing stream and compares.
func ensure(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	// Read first: every session ensures the stream, and a create goes
	// through the cluster's meta leader, which a server's loss takes
	// seconds to elect again.
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile (by another relay, or otherwise).
			s, err = js.Stream(ctx, want.Name)
		} else if err == nil {
			return s, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("relay: stream %s: %w", want.Name, err)
	}
	if diff := streamDifferences(s.CachedInfo().Config, want); len(diff) > 0 {
		return nil, &StreamSettingsError{Stream: want.Name, Differences: diff}
	}
	return s, nil
}

// streamDifferences names each setting the relay manages in which have is
// not want (the server fills in the others; a description is not a
// setting).
func streamDifferences(have, want jetstream.StreamConfig) []string {
	var d []string
	differ := func(name string, h, w any) {
		if h != w {
			d = append(d, fmt.Sprintf("%s %v, configured %v", name, h, w))
		}
	}
	if !slices.Equal(have.Subjects, want.Subjects) {
		differ("Subjects", strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","))
	}
	differ("Retention", have.Retention, want.Retention)
	differ("Discard", have.Discard, want.Discard)
	differ("Storage", have.Storage, want.Storage)
	differ("Replicas", max(have.Replicas, 1), max(want.Replicas, 1))
	if want.Duplicates != 0 {
		differ("Duplicates", have.Duplicates, want.Duplicates)
	}
	differ("MaxMsgsPerSubject", limit(have.MaxMsgsPerSubject), limit(want.MaxMsgsPerSubject))
	differ("MaxMsgs", limit(have.MaxMsgs), limit(want.MaxMsgs))
	differ("MaxAge", have.MaxAge, want.MaxAge)
	differ("MaxBytes", limit(have.MaxBytes), limit(want.MaxBytes))
	differ("MaxMsgSize", limit(int64(have.MaxMsgSize)), limit(int64(want.MaxMsgSize)))
	differ("AllowDirect", have.AllowDirect, want.AllowDirect)
	differ("DenyDelete", have.DenyDelete, want.DenyDelete)
	differ("DenyPurge", have.DenyPurge, want.DenyPurge)
	differ("AllowRollup", have.AllowRollup, want.AllowRollup)
	return d
}

// limit is a stream limit as the server keeps it: 0, unset, is -1.
func limit(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

// EnsureEffectsStream creates the effects' stream (see [EffectsConfig]),
// recording the sequence of the documents' stream it starts at
// (contract.MetaEventsDocsSeq), or checks that the existing one has cfg's
// settings (a [*StreamSettingsError] when not).
func EnsureEffectsStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg.setDefaults()
	// The removals' stream first: a removal is recorded only once it
	// exists.
	if _, err := ensure(ctx, js, removalsStreamConfig(cfg)); err != nil {
		return nil, err
	}
	if cfg.Effects.Partitions > 1 {
		return nil, ensureEffectsPartitions(ctx, js, cfg)
	}
	return effectsStream(ctx, js, cfg, false)
}

// ApplyEffectsStream creates the effects' stream as [EnsureEffectsStream]
// does, or updates it to cfg keeping its metadata: the operator's step,
// which the relay may not take.
func ApplyEffectsStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg.setDefaults()
	want := removalsStreamConfig(cfg)
	if _, err := js.CreateOrUpdateStream(ctx, want); err != nil {
		return nil, fmt.Errorf("relay: apply stream %s: %w", want.Name, err)
	}
	if cfg.Effects.Partitions > 1 {
		return nil, applyEffectsPartitions(ctx, js, cfg)
	}
	return effectsStream(ctx, js, cfg, true)
}

func effectsStream(ctx context.Context, js jetstream.JetStream, cfg Config, update bool) (jetstream.Stream, error) {
	cfg.setDefaults()
	sc := effectsStreamConfig(cfg)
	switch s, err := js.Stream(ctx, sc.Name); {
	case err == nil && update:
		sc.Metadata = s.CachedInfo().Config.Metadata
		if s, err = js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("relay: update stream %s: %w", sc.Name, err)
		}
		return s, nil
	case err == nil:
		if diff := streamDifferences(s.CachedInfo().Config, sc); len(diff) > 0 {
			return nil, &StreamSettingsError{Stream: sc.Name, Differences: diff}
		}
		return s, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("relay: stream %s: %w", sc.Name, err)
	}
	docs, err := js.Stream(ctx, cfg.Stream.Name)
	if err != nil {
		return nil, fmt.Errorf("relay: stream %s: %w", cfg.Stream.Name, err)
	}
	sc.Metadata = map[string]string{contract.MetaEventsDocsSeq: strconv.FormatUint(docs.CachedInfo().State.LastSeq, 10)}
	if s, err := js.CreateStream(ctx, sc); err == nil {
		return s, nil
	} else if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("relay: create stream %s: %w", sc.Name, err)
	}
	// Created meanwhile by another relay.
	return effectsStream(ctx, js, cfg, update)
}
