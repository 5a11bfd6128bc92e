package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/pkg/contract"
)

// PositionBucket is the JetStream key-value bucket where the relay records,
// per slot, the position it confirmed to Postgres: everything before it is
// stored in every stream it publishes to.
//
// Why: Postgres saves a slot's confirmed position only at checkpoints, so
// after a Postgres crash the slot resumes behind what the relay had
// confirmed, and resends transactions that are already in the streams.
// JetStream drops such a republish by its message id within the duplicate
// window, but a restarted NATS server remembers only the ids of messages it
// still stores: the versions the documents' stream's history has removed,
// and the events the notifier has acknowledged out of the effects' stream,
// would be stored again. The record tells a relay where it had got to,
// whatever the slot or the duplicate window remember: a transaction whose
// commit lies before it is not published again.
//
// The record is written before Postgres is told of the position (never
// ahead of what both streams acknowledged), at most once per status
// interval, so that a slot never starts past it; it is trusted only
// for the same cluster and timeline (Postgres's system identifier and
// timeline): after a failover to a standby, whose WAL may end before the
// old primary's, positions are not comparable, and a slot created anew
// has no past.
const PositionBucket = contract.RelayBucket

// Position is the record of [PositionBucket], JSON under the slot's name.
type Position struct {
	LSN      string    `json:"confirmed_lsn"`
	SystemID string    `json:"system_id"`
	Timeline int32     `json:"timeline"`
	At       time.Time `json:"at"`
	// Marks bound a catch-up (see [Mark]), newest first.
	Marks []Mark `json:"marks,omitempty"`
}

// Positions reads and writes the relay's record of one slot.
type Positions struct {
	kv       jetstream.KeyValue
	clock    clock.Clock // of the records' times
	key      string
	systemID string
	timeline int32
	written  pglogrepl.LSN
	// marks are written with the position; marksChanged: since the last
	// write.
	marks        []Mark
	marksChanged bool
}

// OpenPositions creates (or updates) the bucket and returns slot's record;
// a relay's session sets the system and timeline it writes.
func OpenPositions(ctx context.Context, js jetstream.JetStream, slot string, replicas int) (*Positions, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      PositionBucket,
		Description: "converge relay: per slot, the position confirmed to Postgres once every stream stored what precedes it",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("relay: position bucket %s: %w", PositionBucket, err)
	}
	return &Positions{kv: kv, key: slot, clock: clock.Wall()}, nil
}

// Read returns the record; false when there is none.
func (p *Positions) Read(ctx context.Context) (Position, bool, error) {
	return readPosition(ctx, p.kv, p.key)
}

func readPosition(ctx context.Context, kv jetstream.KeyValue, slot string) (Position, bool, error) {
	e, err := kv.Get(ctx, slot)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Position{}, false, nil
	}
	if err != nil {
		return Position{}, false, err
	}
	var p Position
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return Position{}, false, fmt.Errorf("relay: position record of %s: %w", slot, err)
	}
	return p, true, nil
}

// resumeAfter returns the recorded position when it is ahead of the slot's
// start and comparable with it (same system and timeline), else 0.
func (p *Positions) resumeAfter(ctx context.Context, start pglogrepl.LSN) (pglogrepl.LSN, error) {
	rec, ok, err := readPosition(ctx, p.kv, p.key)
	if err != nil || !ok || rec.SystemID != p.systemID || rec.Timeline != p.timeline {
		return 0, err
	}
	lsn, err := pglogrepl.ParseLSN(rec.LSN)
	if err != nil {
		return 0, fmt.Errorf("relay: position record of %s: %w", p.key, err)
	}
	p.written = lsn
	if lsn <= start {
		return 0, nil
	}
	return lsn, nil
}

// Record writes lsn when it moved since the last write, or the marks
// changed.
func (p *Positions) Record(ctx context.Context, lsn pglogrepl.LSN) error {
	if lsn <= p.written && !p.marksChanged {
		return nil
	}
	lsn = max(lsn, p.written)
	b, err := json.Marshal(Position{LSN: lsn.String(), SystemID: p.systemID, Timeline: p.timeline, At: p.clock.Now().UTC(), Marks: p.marks})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := p.kv.Put(ctx, p.key, b); err != nil {
		return fmt.Errorf("relay: record the confirmed position: %w", err)
	}
	p.written, p.marksChanged = lsn, false
	return nil
}

// addMark keeps m, covered by the confirmed position, with the marks.
func (p *Positions) addMark(m Mark) {
	p.marks, p.marksChanged = keepMarks(m, p.marks), true
}

// adopt takes, at a session's start, the system and timeline of Postgres
// and the recorded marks of that same system and timeline.
func (p *Positions) adopt(systemID string, timeline int32, rec Position, hasRec bool) {
	if p.systemID != systemID || p.timeline != timeline {
		p.marks, p.written = nil, 0
	}
	p.systemID, p.timeline = systemID, timeline
	if hasRec && rec.SystemID == systemID && rec.Timeline == timeline && len(p.marks) == 0 {
		for _, m := range rec.Marks {
			if m.Timeline == timeline {
				p.marks = append(p.marks, m)
			}
		}
	}
}
