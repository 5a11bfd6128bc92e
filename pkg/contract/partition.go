package contract

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// Partitions. A deployment may split the documents into a fixed number of
// partitions, each written by one projector instance at a time. The
// partition of a document is a pure function of its key:
// [Partition](key, n). The relay's stream is not changed: the NATS server
// copies it into [PartsStream], each message on the subject
// "converge.part.<partition>.<token>", by the stream source's subject
// transform "converge.docs.*" -> "converge.part.{{partition(n,1)}}.{{wildcard(1)}}"
// (FNV-1a of the token, modulo n), which Partition computes the same way.
const (
	// PartsStream is the stream of document events by partition, sourced
	// by the server from [DocsStream] (see [PartitionTransform]).
	PartsStream = "CONVERGE_DOCS_PARTS"
	// PartsSubjectPrefix prefixes the subjects of [PartsStream].
	PartsSubjectPrefix = "converge.part."
	// MaxPartitions bounds a deployment's partitions: each partition is a
	// durable consumer and a lease per projector.
	MaxPartitions = 16
	// MetaPartitions is the key, in [PartsStream]'s metadata, of its
	// number of partitions.
	MetaPartitions = "converge.partitions"
)

// Partition is the partition (0 to n-1) of the document key in a
// deployment of n partitions: the FNV-1a hash (32 bits) of its subject
// token, modulo n. n <= 1 is a deployment without partitions: 0.
func Partition(key string, n int) int {
	if n <= 1 {
		return 0
	}
	return TokenPartition(SubjectToken(key), n)
}

// TokenPartition is [Partition] of the document whose subject token is
// token.
func TokenPartition(token string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(token))
	return int(h.Sum32() % uint32(n))
}

// PartitionSubjectPrefix is the prefix of partition p's subjects in
// [PartsStream]: "converge.part.<p>.", followed by a document's token.
func PartitionSubjectPrefix(p int) string { return PartsSubjectPrefix + strconv.Itoa(p) + "." }

// PartitionTransform is the subject transform, from [DocsStream]'s
// subjects, of a [PartsStream] of n partitions.
func PartitionTransform(n int) (source, destination string) {
	return DocsSubjectPrefix + "*", PartsSubjectPrefix + "{{partition(" + strconv.Itoa(n) + ",1)}}.{{wildcard(1)}}"
}

// PartitionName is the name of partition p of the projector called name:
// its durable consumer on [PartsStream], its lease, its dead-letter
// subject's last token ("index-p03").
func PartitionName(name string, p int) string {
	s := strconv.Itoa(p)
	if len(s) < 2 {
		s = "0" + s
	}
	return name + "-p" + s
}

// HeaderStreamSource is the header the NATS server sets on each message it
// copies into [PartsStream]: "CONVERGE_DOCS <sequence> ...", the stream and
// the sequence it was copied from.
const HeaderStreamSource = "Nats-Stream-Source"

// SourceSequence is the sequence in [DocsStream] of a message of
// [PartsStream], read from its [HeaderStreamSource] header's value.
func SourceSequence(header string) (uint64, error) {
	fields := strings.Fields(header)
	if len(fields) < 2 {
		return 0, fmt.Errorf("contract: %s %q names no sequence", HeaderStreamSource, header)
	}
	seq, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("contract: %s %q: %w", HeaderStreamSource, header, err)
	}
	return seq, nil
}

// Partitions of effects. A partitioned deployment's notifier takes each
// event from the work queue of its document's partition: the relay
// publishes the event there ([EventsPartitionSubjectPrefix]) instead of to
// [EventsStream], once the operator has made those streams. Each is a
// stream of its own, not a subject filter of one, so that its sequences
// are the partition's alone: the notifier's gap detection counts them.
const (
	// EffectsSubjectPrefix prefixes the subjects of the effects'
	// partitions, "converge.effects.<partition>.<token>".
	EffectsSubjectPrefix = "converge.effects."
)

// EventsPartitionStream is the work queue of partition p of the effects:
// "CONVERGE_EVENTS_P03". Its metadata holds the number of partitions
// ([MetaPartitions]).
func EventsPartitionStream(p int) string { return fmt.Sprintf("%s_P%02d", EventsStream, p) }

// EventsPartitionSubjectPrefix is the prefix of the subjects of
// [EventsPartitionStream](p): "converge.effects.<p>.", followed by a
// document's token.
func EventsPartitionSubjectPrefix(p int) string {
	return EffectsSubjectPrefix + strconv.Itoa(p) + "."
}

// RelayBucket is the relay's JetStream key-value bucket: its confirmed
// position per slot, and its record of the move to the effects'
// partitions ([EffectsMovedKey]).
const RelayBucket = "CONVERGE_RELAY"

// EffectsMovedKey is the key, in [RelayBucket], of the record that a
// relay publishing to the effects' partitions held the slot: from then on
// no relay publishes to [EventsStream]. The partitioned notifier waits for
// it before it finishes EventsStream and lets its partitions run.
const EffectsMovedKey = "effects.moved"

// EffectsMoved is the record at [EffectsMovedKey].
type EffectsMoved struct {
	Partitions int       `json:"partitions"`
	Slot       string    `json:"slot"`
	At         time.Time `json:"at"`
}
