package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// CatchUpMargin is how long before the commit of the newest event the
// stream holds the catch-up starts reading the outbox: the outbox's
// created_at is its transaction's start, and a transaction that began
// earlier may have committed later.
var CatchUpMargin = time.Minute

// CatchUp is what a catch-up published.
type CatchUp struct {
	From       time.Time // outbox rows created from then on were published
	Stored     int       // new in the stream
	Duplicates int       // the stream had them
}

// catchUp publishes, from the outbox table, every event committed after
// the newest one the documents' stream holds (from CatchUpMargin before
// its commit): the slot was missing (PostgreSQL 15 has no failover slots,
// so a promoted standby has none), and what the old primary committed but
// the relay had not published is in the outbox, which streaming
// replication copied. It runs on a fresh slot, before streaming from it:
// events both read here and streamed by the slot are the same messages,
// dropped by their ids. A stream with no event needs none (a first start).
func (r *Relay) catchUp(ctx context.Context, conn *pgconn.PgConn) (CatchUp, bool, error) {
	var cu CatchUp
	s, err := r.js.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		return cu, false, fmt.Errorf("relay: catch-up: %w", err)
	}
	last := s.CachedInfo().State.LastSeq
	if s.CachedInfo().State.Msgs == 0 {
		return cu, false, nil
	}
	m, err := s.GetMsg(ctx, last)
	if err != nil {
		return cu, false, fmt.Errorf("relay: catch-up: the stream's last message %d: %w", last, err)
	}
	committed, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime))
	if err != nil {
		return cu, false, fmt.Errorf("relay: catch-up: the stream's last message %d has no commit time: %w", last, err)
	}
	cu.From = committed.Add(-CatchUpMargin)
	// The replication connection takes the simple protocol only: the
	// time is a formatted literal.
	res, err := conn.Exec(ctx, `SELECT event_id::text, key, version, payload::text, emission, created_at
		FROM outbox WHERE created_at >= '`+cu.From.UTC().Format(time.RFC3339Nano)+`'::timestamptz
		ORDER BY created_at, key, version, emission`).ReadAll()
	if err != nil {
		return cu, true, fmt.Errorf("relay: catch-up: read the outbox: %w", err)
	}
	if len(res) == 0 {
		return cu, true, nil
	}
	for _, row := range res[0].Rows {
		id, key, payload, emission := string(row[0]), row[1], row[3], string(row[4])
		created, err := time.Parse("2006-01-02 15:04:05.999999-07", string(row[5]))
		if err != nil {
			return cu, true, fmt.Errorf("relay: catch-up: created_at %q: %w", row[5], err)
		}
		msg := &nats.Msg{Subject: subjectOf(key), Data: payload, Header: nats.Header{}}
		msg.Header.Set(contract.HeaderCommitTime, created.UTC().Format(time.RFC3339Nano))
		msgID := id
		if emission != "0" {
			msgID = id + "." + emission
			msg.Header.Set(contract.HeaderReemission, emission)
		}
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		targets := []string{msg.Subject}
		if r.cfg.Effects.Enabled {
			targets = append(targets, eventsSubjectOf(msg.Subject))
		}
		for i, subject := range targets {
			msg.Subject = subject
			ack, err := r.js.PublishMsg(ctx, msg)
			if err != nil {
				return cu, true, fmt.Errorf("relay: catch-up: publish %s: %w", msgID, err)
			}
			if i > 0 {
				continue // the effects' copy
			}
			if ack.Duplicate {
				cu.Duplicates++
				r.metrics.CatchUp.WithLabelValues("duplicate").Inc()
			} else {
				cu.Stored++
				r.metrics.CatchUp.WithLabelValues("stored").Inc()
			}
		}
	}
	return cu, true, nil
}

// CatchUpRecord is the last catch-up of a slot, kept in [PositionBucket]
// under "<slot>.catchup" for converge status.
type CatchUpRecord struct {
	At         time.Time `json:"at"`
	From       time.Time `json:"outbox_from"`
	Stored     int       `json:"published"`
	Duplicates int       `json:"already_stored"`
	SystemID   string    `json:"system_id"`
}

// CatchUpKey is the key of slot's catch-up record.
func CatchUpKey(slot string) string { return slot + ".catchup" }

// recordCatchUp keeps cu for converge status; best effort.
func (p *Positions) recordCatchUp(ctx context.Context, slot string, cu CatchUp) error {
	b, err := json.Marshal(CatchUpRecord{At: time.Now().UTC(), From: cu.From.UTC(), Stored: cu.Stored, Duplicates: cu.Duplicates, SystemID: p.systemID})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = p.kv.Put(ctx, CatchUpKey(slot), b)
	return err
}

// ReadCatchUp reads slot's last catch-up with a direct get (ok false:
// none ever happened): what converge status shows.
func ReadCatchUp(ctx context.Context, js jetstream.JetStream, slot string) (CatchUpRecord, bool, error) {
	// A direct get from a stream that does not exist is never answered.
	if _, err := js.Stream(ctx, "KV_"+PositionBucket); errors.Is(err, jetstream.ErrStreamNotFound) {
		return CatchUpRecord{}, false, nil // no relay ever ran
	} else if err != nil {
		return CatchUpRecord{}, false, err
	}
	nc := js.Conn()
	subject := "$KV." + PositionBucket + "." + CatchUpKey(slot)
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+PositionBucket+"."+subject, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return CatchUpRecord{}, false, nil // no bucket: no relay ever ran
	}
	if err != nil {
		return CatchUpRecord{}, false, err
	}
	if status := m.Header.Get("Status"); status == "404" {
		return CatchUpRecord{}, false, nil
	} else if status != "" {
		return CatchUpRecord{}, false, fmt.Errorf("relay: catch-up record: status %s %s", status, m.Header.Get("Description"))
	}
	var rec CatchUpRecord
	if err := json.Unmarshal(m.Data, &rec); err != nil {
		return CatchUpRecord{}, false, fmt.Errorf("relay: catch-up record: %w", err)
	}
	return rec, true, nil
}
