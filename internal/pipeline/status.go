// Package pipeline reads the state of the pipeline for an operator
// (converge status): the relay's slot and the outbox it reads, the streams
// its events feed, and their durable consumers with their progress, dead
// letters and last gap. Every read is one query or one JetStream request
// per thing reported, but for [CheckHolders], which reads the partitions'
// leases again and again for up to a TTL; nothing is written.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// SlotStatus is the relay's replication slot as Postgres reports it.
type SlotStatus struct {
	Name         string `json:"name"`
	Exists       bool   `json:"exists"`
	Active       bool   `json:"active"`
	ActivePID    *int32 `json:"active_pid,omitempty"`
	ConfirmedLSN string `json:"confirmed_flush_lsn,omitempty"`
	// LagBytes is the WAL the slot retains past its confirmed LSN: what
	// the relay has still to publish and confirm.
	LagBytes  int64  `json:"lag_bytes"`
	WALStatus string `json:"wal_status,omitempty"`
}

// OutboxStatus is the outbox the relay publishes from: its rows (kept
// until the writer's retention deletes them) and the oldest one's time.
type OutboxStatus struct {
	Rows   int64      `json:"rows"`
	Oldest *time.Time `json:"oldest,omitempty"`
}

// InboxStatus is what producers handed over in their own transactions
// (converge_inbox): rows the writers have not taken yet, and rows they
// refused (kept with their reason).
type InboxStatus struct {
	Pending       int64      `json:"pending"`
	OldestPending *time.Time `json:"oldest_pending,omitempty"`
	Refused       int64      `json:"refused"`
}

// StreamStatus is a stream's state.
type StreamStatus struct {
	Name      string    `json:"name"`
	Exists    bool      `json:"exists"`
	Messages  uint64    `json:"messages"`
	Bytes     uint64    `json:"bytes"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	LastTime  time.Time `json:"last_time,omitzero"`
	Subjects  uint64    `json:"subjects"`
	Consumers int       `json:"consumers"`
	// Replicas is the stream's configured replica count; Leader the server
	// that leads it on a cluster ("" on a single server), Replicas its
	// followers, each with whether it is current.
	Replicas  int             `json:"replicas"`
	Leader    string          `json:"leader,omitempty"`
	Followers []ReplicaStatus `json:"followers,omitempty"`
}

// ReplicaStatus is a follower of a replicated stream.
type ReplicaStatus struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	Lag     uint64 `json:"lag,omitempty"` // operations behind the leader
}

// ConsumerStatus is a durable consumer of a stream: a projector's, or the
// writer's ingest consumer.
type ConsumerStatus struct {
	Stream      string `json:"stream"`
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`     // not yet delivered
	AckPending  int    `json:"ack_pending"` // delivered, not yet acknowledged
	Redelivered int    `json:"redelivered"`
	AckFloorSeq uint64 `json:"ack_floor_seq"`
	// LastApplied is the Postgres commit time (contract.HeaderCommitTime)
	// of the last message acknowledged in order, nil when unknown.
	LastApplied *time.Time `json:"last_applied_commit_time,omitempty"`
	DeadLetters uint64     `json:"dead_letters"` // on converge.dlq.<name>
	// Missed counts the events a consumer that needs every event (the
	// notifier) never received, and LastGap is the last such gap, as the
	// runtime records them in the consumer's metadata; nil: none recorded.
	Missed  uint64               `json:"missed_events"`
	LastGap *projector.GapRecord `json:"last_gap,omitempty"`
	// Holder, for a partition's consumer (of contract.PartsStream or an
	// effects' partition, see [Partitioned]), is the instance that holds
	// the partition's lease ("" when none does).
	Holder string `json:"holder,omitempty"`
	// HolderNotRenewedMs, set by [CheckHolders], is how long the reader
	// saw the partition's lease unchanged when that is the lease's whole
	// TTL or more: its holder did not renew it (it died, or is cut off
	// from NATS), and another instance may take it over. 0: renewed while
	// watched, or not watched.
	HolderNotRenewedMs int64 `json:"holder_not_renewed_ms,omitempty"`
}

// ConsumedStream is a stream whose durable consumers [ReadConsumers]
// reports.
type ConsumedStream struct {
	Stream string
	// DeadLetters is the name under which the stream's consumers
	// dead-letter (converge.dlq.<DeadLetters>); empty: each consumer's own
	// name, as a projector does.
	DeadLetters string
}

// ReadSlot reads the replication slot named slot of db's database. A slot
// that does not exist is reported with Exists false, not as an error.
func ReadSlot(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (SlotStatus, error) {
	st := SlotStatus{Name: slot}
	err := db.QueryRow(ctx, `
		SELECT active, active_pid, coalesce(confirmed_flush_lsn::text, ''),
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, coalesce(wal_status, '')
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).
		Scan(&st.Active, &st.ActivePID, &st.ConfirmedLSN, &st.LagBytes, &st.WALStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("pipeline: read slot %s: %w", slot, err)
	}
	st.Exists = true
	return st, nil
}

// ReadOutbox counts the outbox's rows and finds the oldest.
func ReadOutbox(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (OutboxStatus, error) {
	var st OutboxStatus
	if err := db.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox`).Scan(&st.Rows, &st.Oldest); err != nil {
		return st, fmt.Errorf("pipeline: read outbox (is the schema migrated?): %w", err)
	}
	return st, nil
}

// ReadInbox reports the inbox's pending and refused rows.
func ReadInbox(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (InboxStatus, error) {
	var st InboxStatus
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE refused_at IS NULL), min(handed_over_at) FILTER (WHERE refused_at IS NULL),
		count(*) FILTER (WHERE refused_at IS NOT NULL) FROM converge_inbox`).Scan(&st.Pending, &st.OldestPending, &st.Refused); err != nil {
		return st, fmt.Errorf("pipeline: read converge_inbox (is the schema migrated?): %w", err)
	}
	return st, nil
}

// ReadStreams reports each stream of names, in order; a stream that does
// not exist is reported with Exists false.
func ReadStreams(ctx context.Context, js jetstream.StreamManager, names ...string) ([]StreamStatus, error) {
	out := make([]StreamStatus, 0, len(names))
	for _, name := range names {
		st := StreamStatus{Name: name}
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			out = append(out, st)
			continue
		}
		if err != nil {
			return out, fmt.Errorf("pipeline: stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return out, fmt.Errorf("pipeline: stream %s: %w", name, err)
		}
		st.Exists = true
		st.Messages, st.Bytes, st.FirstSeq, st.LastSeq = info.State.Msgs, info.State.Bytes, info.State.FirstSeq, info.State.LastSeq
		st.LastTime, st.Subjects, st.Consumers = info.State.LastTime, info.State.NumSubjects, info.State.Consumers
		st.Replicas = max(info.Config.Replicas, 1)
		if c := info.Cluster; c != nil {
			st.Leader = c.Leader
			for _, r := range c.Replicas {
				st.Followers = append(st.Followers, ReplicaStatus{Name: r.Name, Current: r.Current, Offline: r.Offline, Lag: r.Lag})
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// ReadConsumers reports the durable consumers of each stream, in order (a
// stream that does not exist has none), with their number of dead letters
// and the commit time of the last message they acknowledged in order.
func ReadConsumers(ctx context.Context, js jetstream.JetStream, streams ...ConsumedStream) ([]ConsumerStatus, error) {
	dlq, err := deadletter.Open(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	var out []ConsumerStatus
	var leases jetstream.KeyValue // the leases' bucket, opened at the first partition
	for _, cs := range streams {
		s, err := js.Stream(ctx, cs.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("pipeline: stream %s: %w", cs.Stream, err)
		}
		// A work queue (the effects' stream) removes what was acknowledged:
		// there is no message at the floor to read.
		workQueue := s.CachedInfo().Config.Retention == jetstream.WorkQueuePolicy
		lister := s.ListConsumers(ctx)
		for info := range lister.Info() {
			c := ConsumerStatus{Stream: cs.Stream, Name: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending,
				Redelivered: info.NumRedelivered, AckFloorSeq: info.AckFloor.Stream}
			if rec, ok := projector.ReadGapRecord(info.Config.Metadata); ok && rec.Missed > 0 {
				c.Missed, c.LastGap = rec.Missed, &rec
			}
			if info.AckFloor.Stream > 0 && !workQueue {
				// The acknowledged message may be gone (history limits):
				// then its commit time is unknown, not an error.
				if m, err := s.GetMsg(ctx, info.AckFloor.Stream); err == nil {
					if t, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime)); err == nil {
						c.LastApplied = &t
					}
				}
			}
			if Partitioned(cs.Stream) {
				if leases == nil {
					leases, _ = js.KeyValue(ctx, lease.Bucket) // nil when unreadable: no holders
				}
				c.Holder = partitionHolder(ctx, leases, info.Name)
			}
			name := cs.DeadLetters
			if name == "" {
				name = info.Name
			}
			if c.DeadLetters, err = dlq.Count(ctx, name); err != nil {
				return out, fmt.Errorf("pipeline: %w", err)
			}
			out = append(out, c)
		}
		if err := lister.Err(); err != nil {
			return out, fmt.Errorf("pipeline: consumers of %s: %w", cs.Stream, err)
		}
	}
	return out, nil
}

// Partitioned reports whether stream's consumers are partitions', each
// with its lease: the partitioned stream's, or an effects' partition's.
func Partitioned(stream string) bool {
	return stream == contract.PartsStream || strings.HasPrefix(stream, contract.EventsStream+"_P")
}

// Deployment is what a deployment's status reads: its streams, and those
// whose durable consumers it reports. The effects' partitions are among
// them when the operator made them (their number read from the first's
// metadata).
func Deployment(ctx context.Context, js jetstream.JetStream, ingest, ingestDLQ string) (streams []string, consumed []ConsumedStream) {
	streams = []string{contract.DocsStream, contract.EventsStream}
	consumed = []ConsumedStream{{Stream: contract.DocsStream}, {Stream: contract.PartsStream}, {Stream: contract.EventsStream}}
	if s, err := js.Stream(ctx, contract.EventsPartitionStream(0)); err == nil {
		n, _ := strconv.Atoi(s.CachedInfo().Config.Metadata[contract.MetaPartitions])
		for p := range min(max(n, 1), contract.MaxPartitions) {
			streams = append(streams, contract.EventsPartitionStream(p))
			consumed = append(consumed, ConsumedStream{Stream: contract.EventsPartitionStream(p)})
		}
	}
	return append(streams, ingest, deadletter.Stream, contract.PartsStream), append(consumed, ConsumedStream{Stream: ingest, DeadLetters: ingestDLQ})
}

// partitionHolder is the holder of the lease of the partition whose
// consumer is consumer (<name>-pNN), "" when none holds it or it cannot be
// read.
func partitionHolder(ctx context.Context, leases jetstream.KeyValue, consumer string) string {
	if leases == nil {
		return ""
	}
	key, ok := partitionLeaseKey(consumer)
	if !ok {
		return ""
	}
	v, _, err := readLease(ctx, leases, key)
	if err != nil {
		return ""
	}
	return v.Holder
}

// partitionLeaseKey is the key of the lease of the partition whose
// consumer is consumer (<name>-pNN); ok false for another name.
func partitionLeaseKey(consumer string) (key string, ok bool) {
	i := strings.LastIndex(consumer, "-p")
	if i < 0 {
		return "", false
	}
	part, err := strconv.Atoi(consumer[i+2:])
	if err != nil {
		return "", false
	}
	return projector.PartitionLease(consumer[:i], part), true
}

// errNoLease is a lease key absent or deleted: nobody holds it.
var errNoLease = errors.New("pipeline: the lease is not held")

// readLease reads the lease at key and its revision.
func readLease(ctx context.Context, leases jetstream.KeyValue, key string) (lease.Value, uint64, error) {
	v, rev, ok, err := lease.Read(ctx, leases, key)
	if err == nil && !ok {
		err = errNoLease
	}
	return v, rev, err
}

// CheckHolders tells, for the partitions' consumers of cs that name a
// holder, whether the holder still renews its lease, by the leases' rule
// of time: a lease whose revision this reader sees unchanged for the
// lease's whole TTL, on its own monotonic clock, was not renewed for that
// long (HolderNotRenewedMs), whatever the wall clocks of its holder and of
// this machine say; a revision that changes was renewed. The times in the
// lease's value, the holder's wall clock's, are not read. It reads each
// lease every TTL/6 until each is renewed or found not renewed, at most
// for limit (a lease whose TTL is longer is not told); a lease taken over
// or released meanwhile is reported with its holder then. A lease that
// cannot be read is left as it was.
func CheckHolders(ctx context.Context, js jetstream.JetStream, cs []ConsumerStatus, limit time.Duration) {
	type watched struct {
		c    *ConsumerStatus
		key  string
		rev  uint64
		ttl  time.Duration
		seen time.Time // when this reader first saw rev (monotonic)
	}
	var leases jetstream.KeyValue
	var pending []*watched
	poll := limit
	for i := range cs {
		c := &cs[i]
		if !Partitioned(c.Stream) || c.Holder == "" {
			continue
		}
		key, ok := partitionLeaseKey(c.Name)
		if !ok {
			continue
		}
		if leases == nil {
			kv, err := js.KeyValue(ctx, lease.Bucket)
			if err != nil {
				return
			}
			leases = kv
		}
		v, rev, err := readLease(ctx, leases, key)
		if errors.Is(err, errNoLease) {
			c.Holder = ""
			continue
		}
		if err != nil {
			continue
		}
		w := &watched{c: c, key: key, rev: rev, ttl: time.Duration(v.TTLms) * time.Millisecond, seen: time.Now()}
		c.Holder = v.Holder
		if w.ttl <= 0 {
			w.ttl = lease.DefaultTTL
		}
		if w.ttl > limit {
			continue
		}
		poll = min(poll, w.ttl/6)
		pending = append(pending, w)
	}
	deadline := time.Now().Add(limit)
	for len(pending) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(poll):
		}
		left := pending[:0]
		for _, w := range pending {
			// The revision read was the key's at some moment after sent:
			// the silence until then is at least sent - seen.
			sent := time.Now()
			v, rev, err := readLease(ctx, leases, w.key)
			switch {
			case errors.Is(err, errNoLease):
				w.c.Holder = "" // released
			case err != nil:
				left = append(left, w)
			case rev != w.rev:
				w.c.Holder = v.Holder // renewed, or taken over
			case sent.Sub(w.seen) >= w.ttl:
				w.c.HolderNotRenewedMs = sent.Sub(w.seen).Milliseconds()
			default:
				left = append(left, w)
			}
		}
		pending = left
	}
}
