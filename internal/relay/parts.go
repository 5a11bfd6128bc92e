package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// The partitioned stream (contract.PartsStream) is the documents' stream
// by partition: the NATS server sources every message of the documents'
// stream into it, in order, on the subject of the document's partition
// (contract.PartitionTransform). The relay publishes as before and knows
// nothing of it; each partition is a subject filter of it, which one
// projector instance consumes at a time. It is the operator's (`converge
// streams apply -partitions N`), created from the documents' stream's
// first message, so that a projector moving to partitions finds every
// document's history in it.

// ErrRepartition refuses a change of an existing partitioned stream's
// number of partitions without -repartition: every document would move
// to another partition while the instances that hold the old ones write.
var ErrRepartition = errors.New("relay: changing the number of partitions moves most documents to another partition: stop every instance of the partitioned projectors, then apply again with -repartition (the partitioned stream is made anew from the documents' stream, and each partition's consumer starts again from its first message)")

// partsStreamConfig is the partitioned stream of n partitions over the
// documents' stream of cfg (defaults applied): the same limits, so that
// it holds what the documents' stream holds.
func partsStreamConfig(cfg StreamConfig, n int) jetstream.StreamConfig {
	src, dst := contract.PartitionTransform(n)
	docs := docsStreamConfig(cfg)
	return jetstream.StreamConfig{
		Name:        contract.PartsStream,
		Description: "converge document events by partition (" + strconv.Itoa(n) + "), sourced by the server from " + docs.Name,
		Sources: []*jetstream.StreamSource{{Name: docs.Name,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: src, Destination: dst}}}},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           docs.Storage,
		Replicas:          docs.Replicas,
		Duplicates:        docs.Duplicates,
		MaxMsgsPerSubject: docs.MaxMsgsPerSubject,
		MaxAge:            docs.MaxAge,
		MaxMsgSize:        docs.MaxMsgSize,
		Metadata:          map[string]string{contract.MetaPartitions: strconv.Itoa(n)},
	}
}

// PartsResult is what [ApplyPartsStream] did.
type PartsResult string

// The results of [ApplyPartsStream].
const (
	PartsCreated   PartsResult = "created"
	PartsApplied   PartsResult = "applied"
	PartsRecreated PartsResult = "made anew"
)

// ApplyPartsStream creates the partitioned stream of n partitions (2 to
// contract.MaxPartitions) over the documents' stream of cfg, or brings an
// existing one to cfg's limits. A stream of another number of partitions
// is refused ([ErrRepartition]) unless repartition is set: it is then
// deleted with its partitions' consumers and made anew.
func ApplyPartsStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, n int, repartition bool) (PartsResult, error) {
	if n < 2 || n > contract.MaxPartitions {
		return "", fmt.Errorf("relay: -partitions %d: partitions are 2 to %d", n, contract.MaxPartitions)
	}
	cfg.setDefaults()
	want := partsStreamConfig(cfg, n)
	s, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, want); err != nil {
			return "", fmt.Errorf("relay: create stream %s: %w", want.Name, err)
		}
		return PartsCreated, nil
	case err != nil:
		return "", fmt.Errorf("relay: stream %s: %w", want.Name, err)
	}
	if have := s.CachedInfo().Config.Metadata[contract.MetaPartitions]; have != strconv.Itoa(n) {
		if !repartition {
			return "", fmt.Errorf("%w (%s has %s partitions, -partitions %d)", ErrRepartition, want.Name, have, n)
		}
		if err := js.DeleteStream(ctx, want.Name); err != nil {
			return "", fmt.Errorf("relay: delete stream %s: %w", want.Name, err)
		}
		if _, err := js.CreateStream(ctx, want); err != nil {
			return "", fmt.Errorf("relay: create stream %s: %w", want.Name, err)
		}
		return PartsRecreated, nil
	}
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return "", fmt.Errorf("relay: update stream %s: %w", want.Name, err)
	}
	return PartsApplied, nil
}
