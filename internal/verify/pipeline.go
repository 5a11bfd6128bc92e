package verify

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// Pipeline is the [Progress] of the projections read where the pipeline
// records it, in three steps that each hold for the next:
//
//  1. the relay's replication slot has confirmed the position: the relay
//     confirms a position only once JetStream acknowledged every event of
//     the transactions committed before it (or, idle, once nothing it
//     decoded before it is in flight), so those events are in the stream;
//  2. the stream's last sequence, read once step 1 holds, is at or past
//     every one of those events;
//  3. the projector's durable consumer has acknowledged every message up
//     to that sequence: its acknowledgement floor is there, or nothing it
//     was delivered is unacknowledged and it was delivered that far (or
//     everything). A projector acknowledges a message once its store
//     holds the event (or a newer version), or once it dead-lettered it.
type Pipeline struct {
	// DB reads the slot: Postgres, with any role (pg_replication_slots is
	// readable by all).
	DB interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
	// Slot is the relay's replication slot.
	Slot string
	// Stream is the stream of document events, contract.DocsStream.
	Stream string
	JS     jetstream.JetStream
	// Consumers are the projectors' durable consumers by store name
	// ("index": "index", "graph": "graph").
	Consumers map[string]string

	mu         sync.Mutex
	seqs       map[Position]uint64   // the stream's last sequence once a position was confirmed
	thresholds map[string]Thresholds // by projector@sequence, for projectors run in partitions
}

// maxRemembered bounds the positions whose stream sequence is kept.
const maxRemembered = 256

// Passed implements [Progress].
func (p *Pipeline) Passed(ctx context.Context, store string, pos Position) (bool, error) {
	durable, ok := p.Consumers[store]
	if !ok {
		return false, fmt.Errorf("verify: no consumer named for the %s store", store)
	}
	seq, ok, err := p.streamSeq(ctx, pos)
	if err != nil || !ok {
		return false, err
	}
	c, err := p.JS.Consumer(ctx, p.Stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// A projector run in partitions has a consumer per partition on
		// the partitioned stream instead.
		if passed, ok, err := p.partitionsPassed(ctx, durable, seq); ok || err != nil {
			return passed, err
		}
	}
	if err != nil {
		return false, fmt.Errorf("verify: the %s projector's consumer %s on %s: %w", store, durable, p.Stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("verify: the %s projector's consumer %s: %w", store, durable, err)
	}
	return acknowledgedThrough(info, seq), nil
}

// acknowledgedThrough reports whether the consumer has acknowledged every
// message of its filter up to seq: its acknowledgement floor is there, or
// nothing it was delivered is unacknowledged and it was delivered that far
// (or everything).
func acknowledgedThrough(info *jetstream.ConsumerInfo, seq uint64) bool {
	return info.AckFloor.Stream >= seq ||
		(info.NumAckPending == 0 && (info.Delivered.Stream >= seq || info.NumPending == 0))
}

// Thresholds are, for a projector run in partitions, the sequence of the
// partitioned stream each partition's consumer must have acknowledged for
// the projector to have applied the documents' stream up to a sequence:
// by partition, the last message of that partition once the partitioned
// stream had copied that far (a partition without one needs nothing).
type Thresholds map[int]uint64

// PartitionThresholds are the [Thresholds] of the projector called name
// for seq, a sequence of the documents' stream. ok is false when the
// projector does not run in partitions (no partitioned stream, or no
// consumer of its partitions); ready is false while the partitioned stream
// has not copied that far. Read once, they stay right: later messages of a
// partition come after them.
func PartitionThresholds(ctx context.Context, js jetstream.JetStream, name string, seq uint64) (th Thresholds, ok, ready bool, err error) {
	s, err := js.Stream(ctx, contract.PartsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("verify: stream %s: %w", contract.PartsStream, err)
	}
	n, err := strconv.Atoi(s.CachedInfo().Config.Metadata[contract.MetaPartitions])
	if err != nil || n < 2 {
		return nil, false, false, nil
	}
	if _, err := js.Consumer(ctx, contract.PartsStream, contract.PartitionName(name, 0)); err != nil {
		return nil, false, false, nil
	}
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return Thresholds{}, true, seq == 0, nil
	}
	m, err := s.GetMsg(ctx, last)
	if err != nil {
		return nil, true, false, fmt.Errorf("verify: stream %s, message %d: %w", contract.PartsStream, last, err)
	}
	// Where in the documents' stream the copy had come to.
	copied, err := contract.SourceSequence(m.Header.Get(contract.HeaderStreamSource))
	if err != nil {
		return nil, true, false, fmt.Errorf("verify: message %d of %s: %w", last, contract.PartsStream, err)
	}
	if copied < seq {
		return nil, true, false, nil
	}
	th = Thresholds{}
	for part := range n {
		pm, err := s.GetLastMsgForSubject(ctx, contract.PartitionSubjectPrefix(part)+">")
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, true, false, fmt.Errorf("verify: the last message of partition %d: %w", part, err)
		}
		th[part] = pm.Sequence
	}
	return th, true, true, nil
}

// PartitionsAcknowledged reports whether every partition's consumer of
// the projector called name has acknowledged its messages up to th.
func PartitionsAcknowledged(ctx context.Context, js jetstream.JetStream, name string, th Thresholds) (bool, error) {
	for part, through := range th {
		c, err := js.Consumer(ctx, contract.PartsStream, contract.PartitionName(name, part))
		if err != nil {
			return false, fmt.Errorf("verify: the consumer of partition %d of %s: %w", part, name, err)
		}
		if !acknowledgedThrough(c.CachedInfo(), through) {
			return false, nil
		}
	}
	return true, nil
}

// partitionsPassed is [Pipeline.Passed] for a projector run in
// partitions, its thresholds read once per sequence.
func (p *Pipeline) partitionsPassed(ctx context.Context, name string, seq uint64) (passed, ok bool, err error) {
	key := name + "@" + strconv.FormatUint(seq, 10)
	p.mu.Lock()
	th, known := p.thresholds[key]
	p.mu.Unlock()
	if !known {
		var ready bool
		th, ok, ready, err = PartitionThresholds(ctx, p.JS, name, seq)
		if !ok || !ready || err != nil {
			return false, ok, err
		}
		p.mu.Lock()
		if p.thresholds == nil || len(p.thresholds) >= maxRemembered {
			p.thresholds = map[string]Thresholds{}
		}
		p.thresholds[key] = th
		p.mu.Unlock()
	}
	passed, err = PartitionsAcknowledged(ctx, p.JS, name, th)
	return passed, true, err
}

// streamSeq is the stream's last sequence read once the slot confirmed
// pos; ok is false while it has not.
func (p *Pipeline) streamSeq(ctx context.Context, pos Position) (uint64, bool, error) {
	p.mu.Lock()
	seq, ok := p.seqs[pos]
	p.mu.Unlock()
	if ok {
		return seq, true, nil
	}
	confirmed, err := p.confirmed(ctx, pos)
	if err != nil || !confirmed {
		return 0, false, err
	}
	s, err := p.JS.Stream(ctx, p.Stream)
	if err != nil {
		return 0, false, fmt.Errorf("verify: stream %s: %w", p.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("verify: stream %s: %w", p.Stream, err)
	}
	seq = info.State.LastSeq
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seqs == nil {
		p.seqs = map[Position]uint64{}
	}
	if len(p.seqs) >= maxRemembered {
		oldest := pos
		for q := range p.seqs {
			oldest = min(oldest, q)
		}
		delete(p.seqs, oldest)
	}
	p.seqs[pos] = seq
	return seq, true, nil
}

// confirmed reports whether the slot confirmed pos. A position that lies
// in the header of a WAL page whose start the slot confirmed counts as
// confirmed: nothing is written there, and Postgres, idle, reports the
// page's start as the end of its WAL while the insert position is past
// the header.
func (p *Pipeline) confirmed(ctx context.Context, pos Position) (bool, error) {
	var text *string
	var block string
	err := p.DB.QueryRow(ctx, `SELECT (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
		current_setting('wal_block_size')`, p.Slot).Scan(&text, &block)
	if err != nil {
		return false, fmt.Errorf("verify: read slot %s: %w", p.Slot, err)
	}
	if text == nil {
		return false, errors.New("verify: the relay's slot " + p.Slot + " does not exist (or has confirmed nothing)")
	}
	lsn, err := ParseLSN(*text)
	if err != nil {
		return false, err
	}
	size, err := strconv.ParseUint(block, 10, 32)
	if err != nil || size == 0 {
		return false, fmt.Errorf("verify: wal_block_size %q", block)
	}
	// The long header of a segment's first page is 40 bytes, a page's
	// short one 24; a record is longer than the difference.
	const longHeader = 40
	return lsn >= pos || (uint64(lsn)%size == 0 && uint64(pos)-uint64(lsn) <= longHeader), nil
}
