// One replication session: its connections and the slot's lock, the
// catch-up or the resume it starts from, the session's state, and what it
// records when it ends on an error.

package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/pkg/contract"
)

// replicationReadBuffer is the read buffer of the replication connection.
const replicationReadBuffer = 256 << 10

// replicationURL adds replication=database to a DSN.
func replicationURL(dsn string) (string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("relay: postgres url: %w", err)
		}
		q := u.Query()
		q.Set("replication", "database")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " replication=database", nil
}

// ensureEffects reads how many partitions the effects have and ensures
// their streams.
func (r *Relay) ensureEffects(ctx context.Context) error {
	n, err := EffectsPartitions(ctx, r.js)
	if err != nil {
		return err
	}
	cfg := r.cfg
	cfg.Effects.Partitions = n
	if _, err := EnsureEffectsStream(ctx, r.js, cfg); err != nil {
		return err
	}
	r.setEffectsPartitions(n)
	return nil
}

// setEffectsPartitions makes the sessions publish the effects to n
// partitions (none: the effects' stream).
func (r *Relay) setEffectsPartitions(n int) {
	if n > 1 && n != r.cfg.Effects.Partitions {
		r.log.Info("the effects are published to their partitions", "partitions", n,
			"streams", contract.EventsPartitionStream(0)+" to "+contract.EventsPartitionStream(n-1))
	}
	r.effectsStreams, r.effectsPrefixes = nil, nil
	for p := range n {
		r.effectsStreams = append(r.effectsStreams, contract.EventsPartitionStream(p))
		r.effectsPrefixes = append(r.effectsPrefixes, contract.EventsPartitionSubjectPrefix(p))
	}
	r.cfg.Effects.Partitions = n
	r.effectsKnown.Store(int64(n))
}

// beforeSlotLock, when set (tests), runs in each session after it read the
// effects' partitions and before it takes the slot's lock.
var beforeSlotLock func()

// session runs one replication session (runSession); with effects, it
// ends the session when the effects' partitions change meanwhile.
func (r *Relay) session(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	if r.cfg.Effects.Enabled {
		// What the session publishes with: the number read when the
		// streams were ensured, or, until this session ensures them,
		// nothing to compare with.
		known := int64(r.cfg.Effects.Partitions)
		if !r.ensured {
			known = -1
		}
		r.effectsKnown.Store(known)
		go r.watchEffects(ctx, cancel)
	}
	err := r.runSession(ctx)
	if c := context.Cause(ctx); parent.Err() == nil && errors.Is(c, errEffectsMoved) {
		return c
	}
	return err
}

func (r *Relay) runSession(ctx context.Context) error {
	if err := r.awaitConnection(ctx); err != nil {
		return err
	}
	// Ensured by the first session, and again after a session that found
	// no stream (deleted) for a while: a NATS outage at start is a reason
	// to retry, not to exit. Not at every session: on a cluster, right
	// after a stream leader's loss, the stream's API answers nothing for
	// seconds while publishes already fail fast.
	effects := ""
	if r.cfg.Effects.Enabled {
		effects = r.cfg.Effects.Name
	}
	if !r.ensured {
		ectx := ctx
		if r.everEnsured {
			// The streams existed: an answer that takes longer is a
			// cluster electing a leader; the next session asks again.
			var cancel context.CancelFunc
			ectx, cancel = context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
		}
		if _, err := EnsureStream(ectx, r.js, r.cfg.Stream); err != nil {
			return &publishError{err: err}
		}
		if r.cfg.Effects.Enabled {
			if err := r.ensureEffects(ectx); err != nil {
				return &publishError{err: err}
			}
		} else if _, err := r.js.Stream(ctx, r.cfg.Effects.Name); err == nil {
			// Another relay of this slot, or an earlier run, publishes it.
			r.log.Error("the effects' stream exists but this relay runs without -effects: the notifier will not see the events it publishes; run every relay of the slot with -effects (CONVERGE_RELAY_EFFECTS=true)",
				"stream", r.cfg.Effects.Name, "slot", r.cfg.Slot)
		}
		r.ensured, r.everEnsured = true, true
	}
	dsn, err := replicationURL(r.cfg.PostgresURL)
	if err != nil {
		return err
	}
	pcfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("relay: replication connection config: %w", err)
	}
	// A large read buffer takes a backlog from the socket in few reads:
	// the relay's CPU goes mostly to system calls.
	pcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, replicationReadBuffer), w)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("relay: connect for replication: %w", err)
	}
	defer conn.Close(context.Background())

	// The session's ordinary connection: its advisory lock makes this
	// relay the slot's one user until the session ends, catch-up
	// included; it takes the marks and, with synchronous standbys, tells
	// when a transaction is visible.
	db, err := r.connectSQL(ctx)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	if beforeSlotLock != nil {
		beforeSlotLock()
	}
	var locked bool
	if err := db.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('converge.relay/' || $1, 0))`, r.cfg.Slot).Scan(&locked); err != nil {
		return fmt.Errorf("relay: take the slot's lock: %w", err)
	}
	if !locked {
		return errSlotActive
	}
	if r.cfg.Effects.Enabled {
		// Read holding the slot: the partitions may have been made since
		// this relay ensured its streams, and a session that knew them may
		// have held the slot, recorded the move and ended meanwhile. This
		// one must not publish to the effects' stream after that; the
		// next session ensures the streams again (noteStreams).
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := EffectsPartitions(cctx, r.js)
		cancel()
		if err != nil {
			return &publishError{err: fmt.Errorf("reading the effects' partitions: %w", err)}
		}
		if n != r.cfg.Effects.Partitions {
			return errEffectsMoved
		}
	}
	start, created, err := ensureSlot(ctx, conn, r.cfg.Slot)
	if err != nil {
		return err
	}
	if r.positions == nil {
		pos, err := OpenPositions(ctx, r.js, r.cfg.Slot, r.cfg.Stream.Replicas)
		if err != nil {
			return &publishError{err: err}
		}
		pos.clock = r.cfg.Clock
		r.positions = pos
	}
	pos := r.positions
	switch {
	case r.cfg.Effects.Enabled && r.cfg.Effects.Partitions > 1:
		// Holding the slot: no session publishing to the effects' stream
		// runs, and none will (each reads the partitions, and the record,
		// holding the slot).
		if err := pos.RecordEffectsMoved(ctx, r.cfg.Effects.Partitions, r.cfg.Slot); err != nil {
			return &publishError{err: err}
		}
	case r.cfg.Effects.Enabled:
		// Once the move is recorded, the notifier no longer reads the
		// effects' stream: partitions not found now are being made anew,
		// or were deleted.
		moved, ok, err := pos.effectsMoved(ctx)
		if err != nil {
			return &publishError{err: err}
		}
		if ok {
			return &publishError{err: fmt.Errorf("%w (%d partitions, recorded %s), but %s is not found: the operator makes them anew (converge streams apply -effects -effects-partitions N); nothing is published until they exist",
				errEffectsGone, moved.Partitions, moved.At.Format(time.RFC3339), contract.EventsPartitionStream(0))}
		}
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("relay: identify system: %w", err)
	}
	rec, hasRec, err := pos.Read(ctx)
	if err != nil {
		return &publishError{err: fmt.Errorf("read the recorded position: %w", err)}
	}
	plan, err := r.planCatchUp(ctx, conn, start, created, rec, hasRec, sys)
	if err != nil {
		return err
	}
	pos.adopt(sys.SystemID, sys.Timeline, rec, hasRec)
	var skipUntil pglogrepl.LSN
	var caughtUp *CatchUp
	if plan.reason != "" {
		var active bool
		if err := db.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&active); err != nil {
			return fmt.Errorf("relay: read slot %s: %w", r.cfg.Slot, err)
		}
		if active {
			return errSlotActive // a relay cut off from this one's lock streams still
		}
		window := "the whole outbox"
		if plan.mark != nil {
			window = "rows the mark of " + plan.mark.At.UTC().Format(time.RFC3339) + " does not see"
		}
		r.log.Warn("catching up from the outbox before streaming from the slot", "slot", r.cfg.Slot, "reason", plan.reason, "window", window)
		cu, err := r.catchUp(ctx, db, pos, plan, sys)
		if err != nil {
			// Nothing is recorded: the next session, of this relay or
			// another, decides the same and resumes.
			var pe *publishError
			if !errors.As(err, &pe) && ctx.Err() == nil {
				err = &publishError{err: err}
			}
			return err
		}
		r.log.Warn("caught up from the outbox; streaming from the slot", "slot", r.cfg.Slot, "reason", cu.Reason, "window", cu.Window,
			"rows_read", cu.Read, "published", cu.Stored, "already_stored", cu.Duplicates, "held_by_stream", cu.Held)
		if err := pos.finishCatchUp(ctx, r.cfg.Slot, cu); err != nil {
			r.log.Warn("recording the catch-up for converge status failed", "err", err)
		}
		// Everything before the slot's start is in the streams now: a
		// restart need not catch up again.
		if err := pos.Record(ctx, start); err != nil {
			return &publishError{err: err}
		}
		caughtUp = &cu
	} else if skipUntil, err = pos.resumeAfter(ctx, start); err != nil {
		return &publishError{err: err}
	} else if skipUntil > 0 {
		r.log.Warn("the slot is behind the position this relay recorded (Postgres saved the slot before its last confirmation, then restarted): transactions committed before the recorded position are already in the streams and are not published again",
			"slot", r.cfg.Slot, "slot_lsn", start.String(), "recorded_lsn", skipUntil.String())
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another relay holds it
		return errSlotActive
	}
	if err != nil {
		return fmt.Errorf("relay: start replication on slot %s: %w", r.cfg.Slot, err)
	}
	pub, err := newPublisher(r.nc, r.cfg.Stream.Name, effects, r.cfg.Window)
	if err != nil {
		return &publishError{err: err}
	}
	defer pub.close()
	pub.refusedMetric = r.metrics.Refused
	s := &session{relay: r, conn: conn, db: db, pub: pub, confirmed: start, relations: map[uint32]relation{}, pos: pos, skipUntil: skipUntil, timeline: sys.Timeline}
	if caughtUp != nil {
		s.seen, s.seenEnd = &caughtUp.Seen, caughtUp.SeenEnd
	}
	// The slot's position is the truth at the start of a session, even
	// when a Postgres crash moved it back behind what was reported before.
	r.confirmed.Store(uint64(start))
	r.metrics.ConfirmedLSN.Set(float64(start))
	r.active.Store(true)
	r.metrics.Active.Set(1)
	r.log.Info("relaying", "slot", r.cfg.Slot, "from_lsn", start.String(), "stream", r.cfg.Stream.Name, "effects_stream", effects)
	err = s.loop(ctx)
	var pe *publishError
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.As(err, &pe):
		// The slot starts there, for this relay's next session or a
		// standby's; best effort (without it, duplicates the window drops).
		if lsn := s.storedUpTo(); lsn > start {
			if lsn > s.reported {
				if err := pos.Record(context.Background(), lsn); err != nil {
					r.log.Warn("recording the confirmed position failed", "err", err)
				} else {
					sctx, cancel := context.WithTimeout(context.Background(), time.Second)
					_ = pglogrepl.SendStandbyStatusUpdate(sctx, conn, pglogrepl.StandbyStatusUpdate{
						WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ClientTime: r.cfg.Clock.Now()})
					cancel()
				}
			}
		}
	default:
		s.recordOnError()
	}
	return err
}

// connectSQL opens the session's ordinary connection. A backend idle
// for sqlIdleTimeout ends its session, and with it the lock: a relay cut
// off from Postgres does not keep the slot from its standby for longer.
func (r *Relay) connectSQL(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(r.cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("relay: postgres url: %w", err)
	}
	idle := max(sqlIdleTimeout, 3*r.cfg.StatusInterval)
	cfg.RuntimeParams["idle_session_timeout"] = strconv.Itoa(int(idle / time.Millisecond))
	cfg.RuntimeParams["application_name"] = "converge-relay"
	db, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("relay: connect: %w", err)
	}
	return db, nil
}

// sqlIdleTimeout is how long the session's ordinary connection may stay
// idle (or three status intervals, if longer): it is used at every one.
const sqlIdleTimeout = 30 * time.Second

// awaitConnection returns once the NATS connection is up: a session is
// not begun, and Postgres not asked for the slot, while it reconnects (the
// relay's connection fails every request meanwhile, buffering none).
func (r *Relay) awaitConnection(ctx context.Context) error {
	if r.nc.IsConnected() {
		return nil
	}
	status := r.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer r.nc.RemoveStatusListener(status)
	for {
		switch st := r.nc.Status(); st {
		case nats.CONNECTED:
			return nil
		case nats.CLOSED:
			return &publishError{err: errors.New("the NATS connection is closed")}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-status:
		case <-time.After(time.Second):
		}
	}
}

// recordOnError records, when a session fails because Postgres went away,
// the transactions acknowledged since the last status update: the slot
// will resend them, and the next session need not publish them again. Not
// when publishing failed: a NATS server that died may not have written the
// messages it acknowledged last (it acknowledges before its file store
// writes them out), and those must be published again.
func (s *session) recordOnError() {
	// The acknowledgements on their way, for a second at most; a failed
	// publish ends the wait.
	deadline := time.Now().Add(time.Second)
	for s.drain(context.Background(), false) == nil && s.head < len(s.queue) && time.Now().Before(deadline) {
		select {
		case <-s.pub.wake:
		case <-time.After(time.Until(deadline)):
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.pos.Record(ctx, s.confirmed); err != nil {
		s.relay.log.Warn("recording the confirmed position failed", "err", err)
	}
}

// publishError is a failed publish: the session ends and resumes from the
// confirmed position.
type publishError struct{ err error }

func (e *publishError) Error() string { return "relay: publish: " + e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

type session struct {
	relay     *Relay
	conn      *pgconn.PgConn
	pub       *publisher
	relations map[uint32]relation

	// db is the session's ordinary connection (see Relay.session).
	// pendingMark is the newest snapshot taken, a mark once the confirmed
	// position reaches its LSN. gated: Postgres has synchronous standbys,
	// and a transaction is published only once visible (snap: the newest
	// snapshot read), which is once they confirmed its commit.
	db          *pgx.Conn
	timeline    int32
	pendingMark *Mark
	gated       bool
	snap        pgSnapshot

	queue         []pending // FIFO in publish order
	head          int
	inflight      int
	inflightBytes int

	inTx          bool
	commitTime    time.Time
	commitTimeHdr []string
	view          insertView
	stopWake      func()
	finishing     bool      // cancelled, finishing the transaction in progress
	finishBy      time.Time // when finishing gives up

	confirmed  pglogrepl.LSN
	reported   pglogrepl.LSN // the last position sent to Postgres
	nextStatus time.Time

	// pos records the confirmed position in JetStream; transactions whose
	// commit precedes skipUntil (the recorded position, when the slot
	// resumed behind it) are already in the streams: skipping marks the
	// events of such a transaction, which are not published again.
	pos       *Positions
	skipUntil pglogrepl.LSN
	skipping  bool
	// seen, after a catch-up, is the snapshot it read the outbox in: a
	// transaction committed before seenEnd that it sees was handled by
	// the catch-up, and is skipped too.
	seen    *pgSnapshot
	seenEnd pglogrepl.LSN

	// acks are the transactions confirmed within flushMargin of the newest
	// acknowledgement (from acksHead on), storedEnd the end of the newest
	// one older than that; newestAck is when the newest acknowledgement
	// consumed arrived.
	acks      []txAck
	acksHead  int
	storedEnd pglogrepl.LSN
	newestAck time.Time
}
