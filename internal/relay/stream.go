package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// EnsureStream creates the document stream, or updates it to cfg.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg.setDefaults()
	want := jetstream.StreamConfig{
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
	// Read first, and change only what differs: every session ensures the
	// stream, and an update goes through the cluster's meta leader, which
	// a server's loss takes seconds to elect again.
	if s, err := js.Stream(ctx, cfg.Name); err == nil && sameStreamConfig(s.CachedInfo().Config, want) {
		return s, nil
	}
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("relay: ensure stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// sameStreamConfig reports whether have already is want in every setting
// the relay manages (the server fills in the others).
func sameStreamConfig(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Discard == want.Discard && have.Storage == want.Storage &&
		max(have.Replicas, 1) == max(want.Replicas, 1) && (want.Duplicates == 0 || have.Duplicates == want.Duplicates) &&
		limit(have.MaxMsgsPerSubject) == limit(want.MaxMsgsPerSubject) && have.MaxAge == want.MaxAge &&
		limit(have.MaxBytes) == limit(want.MaxBytes) && have.MaxMsgSize == want.MaxMsgSize && have.AllowDirect == want.AllowDirect
}

// limit is a stream limit as the server keeps it: 0, unset, is -1.
func limit(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

// EnsureEffectsStream creates the effects' stream (see [EffectsConfig]), or
// updates it to cfg, keeping the sequence of the documents' stream it
// started at (contract.MetaEventsDocsSeq).
func EnsureEffectsStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg.setDefaults()
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
	switch s, err := js.Stream(ctx, e.Name); {
	case err == nil:
		sc.Metadata = s.CachedInfo().Config.Metadata
		if sameStreamConfig(s.CachedInfo().Config, sc) {
			return s, nil
		}
		s, err = js.UpdateStream(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("relay: update stream %s: %w", e.Name, err)
		}
		return s, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("relay: stream %s: %w", e.Name, err)
	}
	docs, err := js.Stream(ctx, cfg.Stream.Name)
	if err != nil {
		return nil, fmt.Errorf("relay: stream %s: %w", cfg.Stream.Name, err)
	}
	sc.Metadata = map[string]string{contract.MetaEventsDocsSeq: strconv.FormatUint(docs.CachedInfo().State.LastSeq, 10)}
	s, err := js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Created meanwhile by another relay.
		return js.Stream(ctx, e.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("relay: create stream %s: %w", e.Name, err)
	}
	return s, nil
}
