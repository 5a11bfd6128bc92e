package relay

import (
	"context"
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
