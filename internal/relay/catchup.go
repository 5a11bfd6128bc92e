package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// A catch-up publishes, from the outbox table, the events the documents'
// stream lacks, before a session streams from its slot. A slot streams
// only what commits after its position, so the slot alone cannot be
// trusted when it did not carry on from where this relay's streams end:
//
//   - it is new: created by this session (a promoted standby has no slot
//     on PostgreSQL 15), by `converge migrate up`, by another relay;
//   - Postgres is another timeline (a failover) or another system than
//     the one the relay's record was written on, or there is no record;
//   - its position is past the position the relay recorded.
//
// Otherwise the slot resends everything after its position, and nothing
// is read from the table. A catch-up that did not finish (a crash, a stop,
// a lost connection) leaves the record as it was, so the next session of
// any relay decides the same and resumes it.
//
// What it reads is bounded by the newest mark (see [Mark]) valid on this
// timeline: the rows whose transaction the mark's snapshot does not see,
// however long that transaction stayed open and whatever the server's
// time zone or date style. With no valid mark (none recorded yet, another
// system, a standby whose WAL ended before every mark) it reads the whole
// outbox. Rows are read in (key, version, emission) order, streamed in
// bounded memory; for each document the stream's newest message says
// which of its rows the stream already holds, and only the later ones are
// published, in order. Progress is recorded every catchUpBatch rows, so
// that a catch-up interrupted resumes after the last row it had stored.
//
// One relay catches up at a time: every session first takes an advisory
// lock named after the slot and holds it until it ends, so a second
// relay waits as a standby and never streams while the first is still
// catching up.

// CatchUp is what a catch-up did.
type CatchUp struct {
	Reason     string    // why the slot could not be trusted
	Window     string    // "snapshot" (rows the mark does not see) or "outbox" (every row)
	From       time.Time // when the mark was taken; zero for the whole outbox
	Read       int       // outbox rows read
	Stored     int       // new in the stream
	Duplicates int       // the stream had them already (its duplicate window)
	Held       int       // the stream held them or a later event of their document
	// Seen is the snapshot the rows were read in, taken when the WAL
	// ended at SeenEnd: a transaction it sees was handled here, and the
	// slot's copy of it, which commits before SeenEnd, is not published
	// again.
	Seen    pgSnapshot
	SeenEnd pglogrepl.LSN
}

// catchUpBatch is how many rows are published between two records of a
// catch-up's progress; catchUpWindow, how many at most await their
// acknowledgement.
const (
	catchUpBatch  = 1000
	catchUpWindow = 256
)

// catchUpPlan is a session's decision: whether to catch up, and from
// which mark (nil: the whole outbox).
type catchUpPlan struct {
	reason string
	mark   *Mark
	snap   pgSnapshot
}

// planCatchUp decides from the slot (its position start, and whether this
// session created it), the relay's record and the server's timeline.
func (r *Relay) planCatchUp(ctx context.Context, conn *pgconn.PgConn, start pglogrepl.LSN, created bool, rec Position, hasRec bool, sys pglogrepl.IdentifySystemResult) (catchUpPlan, error) {
	var plan catchUpPlan
	recLSN, _ := pglogrepl.ParseLSN(rec.LSN)
	switch {
	case created:
		plan.reason = "the slot was missing"
	case !hasRec:
		plan.reason = "no relay recorded a position for this slot"
	case rec.SystemID != sys.SystemID:
		plan.reason = "the position was recorded on another Postgres system"
	case rec.Timeline != sys.Timeline:
		plan.reason = fmt.Sprintf("Postgres is on timeline %d, the position was recorded on %d (a failover)", sys.Timeline, rec.Timeline)
	case start > recLSN:
		plan.reason = fmt.Sprintf("the slot starts at %s, past the recorded position %s (made or moved by someone else)", start, recLSN)
	default:
		return plan, nil
	}
	if !hasRec || rec.SystemID != sys.SystemID {
		return plan, nil // the whole outbox
	}
	var history []byte
	for i := range rec.Marks {
		m := rec.Marks[i]
		if m.Timeline != sys.Timeline {
			// Valid only if this server's history left m's timeline at or
			// after m's LSN: every transaction m sees is here.
			if history == nil {
				h, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
				if err != nil {
					return plan, fmt.Errorf("relay: catch-up: timeline history: %w", err)
				}
				history = h.Content
			}
			if end, ok := timelineSwitch(history, m.Timeline); !ok || m.lsn() > end {
				continue
			}
		}
		snap, err := parseSnapshot(m.Snapshot)
		if err != nil {
			continue
		}
		plan.mark, plan.snap = &m, snap
		break
	}
	return plan, nil
}

// windowID names what a catch-up reads, for resuming it: the same window
// on the same system and timeline.
func (p catchUpPlan) windowID(sys pglogrepl.IdentifySystemResult) string {
	w := "outbox"
	if p.mark != nil {
		w = "snapshot " + p.mark.Snapshot
	}
	return fmt.Sprintf("%s on %s/%d", w, sys.SystemID, sys.Timeline)
}

// catchUpCursor is a catch-up's progress: every row up to (Key, Version,
// Emission) of the window is in the streams. Snapshot and LSN are those of
// its first attempt's read (see CatchUp.Seen).
type catchUpCursor struct {
	Window   string `json:"window"`
	Snapshot string `json:"snapshot"`
	LSN      string `json:"lsn"`
	Key      string `json:"key"`
	Version  int64  `json:"version"`
	Emission int64  `json:"emission"`
	Read     int    `json:"read"`
}

// catchUpCursorKey is the key of slot's catch-up progress in [PositionBucket].
func catchUpCursorKey(slot string) string { return slot + ".catchup-cursor" }

// outboxColumns reports which of the columns later migrations added the
// outbox has: the catch-up reads what there is.
func outboxColumns(ctx context.Context, db *pgx.Conn) (emission, trace, xid bool, err error) {
	err = db.QueryRow(ctx, `SELECT
		EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'emission' AND NOT attisdropped),
		EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'trace_context' AND NOT attisdropped),
		EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'xid' AND NOT attisdropped)`).Scan(&emission, &trace, &xid)
	if err != nil {
		err = fmt.Errorf("relay: read the outbox's columns: %w", err)
	}
	return emission, trace, xid, err
}

// catchUp carries out plan over db, the session's ordinary connection.
func (r *Relay) catchUp(ctx context.Context, db *pgx.Conn, pos *Positions, plan catchUpPlan, sys pglogrepl.IdentifySystemResult) (CatchUp, error) {
	cu := CatchUp{Reason: plan.reason, Window: "outbox"}
	emission, trace, xid, err := outboxColumns(ctx, db)
	if err != nil {
		return cu, err
	}
	stream, err := r.js.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		return cu, fmt.Errorf("relay: catch-up: %w", err)
	}
	window := plan.windowID(sys)
	var where []string
	var args []any
	if plan.mark != nil && xid {
		cu.Window, cu.From = "snapshot", plan.mark.At
		// Rows without an xid were written before the column existed,
		// before any mark was taken: every mark sees them.
		args = append(args, strconv.FormatUint(plan.snap.xmin, 10), plan.mark.Snapshot)
		where = append(where, "xid >= $1::xid8 AND NOT pg_visible_in_snapshot(xid, $2::pg_snapshot)")
	}
	emissionCol, traceCol := "0::bigint", "NULL::text"
	if emission {
		emissionCol = "emission"
	}
	if trace {
		traceCol = "trace_context"
	}
	// One snapshot for the whole read, named so that the session can
	// tell which transactions it saw.
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return cu, fmt.Errorf("relay: catch-up: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // read-only: nothing to keep
	var seen, seenEnd string
	if err := tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text`).Scan(&seen, &seenEnd); err != nil {
		return cu, fmt.Errorf("relay: catch-up: read its snapshot: %w", err)
	}
	cur, resumed, err := pos.readCursor(ctx, window)
	if err != nil {
		return cu, err
	}
	if resumed {
		// What the first attempt saw and handled, up to the cursor; what
		// this one sees besides, past the cursor, is recent enough for the
		// duplicate window to drop the slot's copy.
		seen, seenEnd = cur.Snapshot, cur.LSN
	}
	if cu.Seen, err = parseSnapshot(seen); err != nil {
		return cu, err
	}
	if cu.SeenEnd, err = pglogrepl.ParseLSN(seenEnd); err != nil {
		return cu, fmt.Errorf("relay: catch-up: %w", err)
	}
	if resumed {
		n := len(args)
		args = append(args, cur.Key, cur.Version, cur.Emission)
		where = append(where, fmt.Sprintf("(key, version, %s) > ($%d, $%d, $%d)", emissionCol, n+1, n+2, n+3))
		cu.Read = cur.Read
		r.log.Info("resuming the catch-up", "slot", r.cfg.Slot, "after_key", cur.Key, "rows_read", cur.Read)
	}
	sql := `SELECT event_id::text, key, version, payload::text, ` + emissionCol + `, created_at, ` + traceCol + ` FROM outbox`
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY key, version, " + emissionCol
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return cu, fmt.Errorf("relay: catch-up: read the outbox: %w", err)
	}
	defer rows.Close()

	// A JetStream context of its own: the publishes of a catch-up that
	// failed (a NATS restart) time out with it, and leave nothing pending
	// for the next one to wait on.
	js, err := jetstream.New(r.nc, jetstream.WithPublishAsyncTimeout(r.cfg.AckTimeout), jetstream.WithPublishAsyncMaxPending(2*catchUpWindow))
	if err != nil {
		return cu, fmt.Errorf("relay: catch-up: %w", err)
	}
	p := &catchUpPublisher{relay: r, js: js, stream: stream, cu: &cu}
	progress := time.Now().Add(5 * time.Second)
	var row catchUpRow
	for rows.Next() {
		if err := rows.Scan(&row.eventID, &row.key, &row.version, &row.payload, &row.emission, &row.created, &row.trace); err != nil {
			return cu, fmt.Errorf("relay: catch-up: read an outbox row: %w", err)
		}
		cu.Read++
		if err := p.add(ctx, row); err != nil {
			return cu, err
		}
		if p.unrecorded >= catchUpBatch {
			if err := p.flush(ctx); err != nil {
				return cu, err
			}
			if err := pos.writeCursor(ctx, catchUpCursor{Window: window, Snapshot: seen, LSN: seenEnd, Key: row.key, Version: row.version, Emission: row.emission, Read: cu.Read}); err != nil {
				return cu, err
			}
		}
		if time.Now().After(progress) {
			progress = time.Now().Add(5 * time.Second)
			r.log.Info("catching up from the outbox", "slot", r.cfg.Slot, "rows_read", cu.Read, "published", cu.Stored, "already_in_stream", cu.Held+cu.Duplicates)
		}
	}
	if err := rows.Err(); err != nil {
		return cu, fmt.Errorf("relay: catch-up: read the outbox: %w", err)
	}
	if err := p.flush(ctx); err != nil {
		return cu, err
	}
	rows.Close()
	if err := tx.Commit(ctx); err != nil {
		return cu, fmt.Errorf("relay: catch-up: end its read: %w", err)
	}
	return cu, nil
}

// catchUpRow is one row a catch-up read.
type catchUpRow struct {
	eventID, key, payload string
	version, emission     int64
	created               time.Time
	trace                 *string
}

// catchUpPublisher publishes a catch-up's rows asynchronously, checking
// each document's newest message in the stream once.
type catchUpPublisher struct {
	relay      *Relay
	js         jetstream.JetStream
	stream     jetstream.Stream
	cu         *CatchUp
	key        string // the document of the rows being added
	held       bool   // the stream's newest message of key, when it has one
	heldVer    int64
	heldEm     int64
	futures    []jetstream.PubAckFuture
	effects    []jetstream.PubAckFuture // the copies to the effects' stream
	unrecorded int                      // rows added since the last flush
}

func (p *catchUpPublisher) add(ctx context.Context, row catchUpRow) error {
	if row.key != p.key {
		p.key = row.key
		var err error
		p.held, p.heldVer, p.heldEm, err = newestInStream(ctx, p.stream, subjectOf([]byte(row.key)))
		if err != nil {
			return err
		}
	}
	p.unrecorded++
	held := p.held && (p.heldVer > row.version || p.heldVer == row.version && p.heldEm >= row.emission)
	if held {
		p.cu.Held++
		p.relay.metrics.CatchUp.WithLabelValues("held").Inc()
		if !p.relay.cfg.Effects.Enabled {
			return nil
		}
	}
	msg := &nats.Msg{Subject: subjectOf([]byte(row.key)), Data: []byte(row.payload), Header: nats.Header{}}
	msg.Header.Set(contract.HeaderCommitTime, row.created.UTC().Format(time.RFC3339Nano))
	msgID := row.eventID
	if row.emission != 0 {
		msgID += "." + strconv.FormatInt(row.emission, 10)
		msg.Header.Set(contract.HeaderReemission, strconv.FormatInt(row.emission, 10))
	}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if row.trace != nil {
		msg.Header.Set(traceParentHeader, *row.trace)
	}
	if !held {
		f, err := p.js.PublishMsgAsync(msg)
		if err != nil {
			return &publishError{err: fmt.Errorf("catch-up: publish %s: %w", msgID, err)}
		}
		p.futures = append(p.futures, f)
	}
	if p.relay.cfg.Effects.Enabled {
		// Also for a row the documents' stream holds: whether its copy for
		// effects is stored cannot be read (a work queue keeps nothing
		// acknowledged), and a catch-up that stopped between the two
		// acknowledgements would otherwise leave it out for good. Published
		// again, it is one effect: the stream's duplicate window drops it,
		// or the notifier's dedup store knows it.
		subject, _ := p.relay.effectsTarget(msg.Subject)
		effects := &nats.Msg{Subject: subject, Data: msg.Data, Header: msg.Header}
		f, err := p.js.PublishMsgAsync(effects)
		if err != nil {
			return &publishError{err: fmt.Errorf("catch-up: publish %s to the effects' stream: %w", msgID, err)}
		}
		p.effects = append(p.effects, f)
	}
	if len(p.futures) >= catchUpWindow || len(p.effects) >= catchUpWindow {
		return p.await(ctx)
	}
	return nil
}

// await waits for the acknowledgement of every publish made.
func (p *catchUpPublisher) await(ctx context.Context) error {
	select {
	case <-p.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.relay.cfg.AckTimeout):
		return &publishError{err: fmt.Errorf("catch-up: %w: waited %v", errAckTimeout, p.relay.cfg.AckTimeout)}
	}
	for _, f := range p.futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				p.cu.Duplicates++
				p.relay.metrics.CatchUp.WithLabelValues("duplicate").Inc()
			} else {
				p.cu.Stored++
				p.relay.metrics.CatchUp.WithLabelValues("stored").Inc()
			}
		case err := <-f.Err():
			return &publishError{err: fmt.Errorf("catch-up: publish %s: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err)}
		}
	}
	for _, f := range p.effects {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return &publishError{err: fmt.Errorf("catch-up: publish %s to the effects' stream: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err)}
		}
	}
	p.futures, p.effects = p.futures[:0], p.effects[:0]
	return nil
}

// flush waits for every publish, and the rows added are all stored.
func (p *catchUpPublisher) flush(ctx context.Context) error {
	if err := p.await(ctx); err != nil {
		return err
	}
	p.unrecorded = 0
	return nil
}

// newestInStream reads the version and emission of the newest message on
// subject; held false when the stream has none.
func newestInStream(ctx context.Context, s jetstream.Stream, subject string) (held bool, version, emission int64, err error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, 0, 0, nil
	}
	if err != nil {
		return false, 0, 0, &publishError{err: fmt.Errorf("catch-up: the stream's newest message on %s: %w", subject, err)}
	}
	var ev struct {
		Version int64 `json:"version"`
	}
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return false, 0, 0, fmt.Errorf("relay: catch-up: the stream's message %d on %s: %w", m.Sequence, subject, err)
	}
	if e := m.Header.Get(contract.HeaderReemission); e != "" {
		if emission, err = strconv.ParseInt(e, 10, 64); err != nil {
			return false, 0, 0, fmt.Errorf("relay: catch-up: the stream's message %d on %s: emission %q: %w", m.Sequence, subject, e, err)
		}
	}
	return true, ev.Version, emission, nil
}

// readCursor returns the progress of a catch-up of window, if one was
// interrupted.
func (p *Positions) readCursor(ctx context.Context, window string) (catchUpCursor, bool, error) {
	e, err := p.kv.Get(ctx, catchUpCursorKey(p.key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return catchUpCursor{}, false, nil
	}
	if err != nil {
		return catchUpCursor{}, false, &publishError{err: fmt.Errorf("catch-up: read its progress: %w", err)}
	}
	var c catchUpCursor
	if err := json.Unmarshal(e.Value(), &c); err != nil || c.Window != window {
		return catchUpCursor{}, false, nil // another window's (or unreadable): start over
	}
	return c, true, nil
}

func (p *Positions) writeCursor(ctx context.Context, c catchUpCursor) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := p.kv.Put(ctx, catchUpCursorKey(p.key), b); err != nil {
		return &publishError{err: fmt.Errorf("catch-up: record its progress: %w", err)}
	}
	return nil
}

// finishCatchUp removes the progress of a finished catch-up and keeps its
// record for converge status; best effort.
func (p *Positions) finishCatchUp(ctx context.Context, slot string, cu CatchUp) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := p.kv.Delete(ctx, catchUpCursorKey(slot)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	b, err := json.Marshal(CatchUpRecord{At: p.clock.Now().UTC(), Reason: cu.Reason, Window: cu.Window, From: cu.From.UTC(), Read: cu.Read,
		Stored: cu.Stored, Duplicates: cu.Duplicates, Held: cu.Held, SystemID: p.systemID})
	if err != nil {
		return err
	}
	_, err = p.kv.Put(ctx, CatchUpKey(slot), b)
	return err
}

// CatchUpRecord is the last catch-up of a slot, kept in [PositionBucket]
// under "<slot>.catchup" for converge status.
type CatchUpRecord struct {
	At         time.Time `json:"at"`
	Reason     string    `json:"reason,omitempty"`
	Window     string    `json:"window,omitempty"`
	From       time.Time `json:"outbox_from"`
	Read       int       `json:"rows_read"`
	Stored     int       `json:"published"`
	Duplicates int       `json:"already_stored"`
	Held       int       `json:"held_by_stream"`
	SystemID   string    `json:"system_id"`
}

// CatchUpKey is the key of slot's catch-up record.
func CatchUpKey(slot string) string { return slot + ".catchup" }

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
