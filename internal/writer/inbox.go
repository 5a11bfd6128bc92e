package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/retry"
)

// InboxChannel is the channel the inbox's trigger notifies when a
// transaction that handed documents over commits (migration 8).
const InboxChannel = "converge_inbox"

// Defaults of an [InboxConfig].
const (
	// DefaultInboxBatch is how many handed-over rows one transaction
	// takes.
	DefaultInboxBatch = 256
	// DefaultInboxParallel is how many transactions of one writer drain
	// at once, as the batch API's clients write at once.
	DefaultInboxParallel = 4
)

// InboxConfig of the inbox's drain.
type InboxConfig struct {
	// Off: the writer does not drain converge_inbox (another writer
	// does, or no producer hands documents over).
	Off bool
	// BatchSize is how many rows one transaction takes; default
	// DefaultInboxBatch.
	BatchSize int
	// Parallel is how many transactions drain at once; default
	// DefaultInboxParallel. Rows of one document taken by two of them
	// are applied in either order: the freshness guard keeps the newest
	// version, as for two PUTs.
	Parallel int
	// RetryMin and RetryMax bound the backoff after a failure (the
	// database unreachable); defaults 100ms and 10s.
	RetryMin, RetryMax time.Duration
}

func (c *InboxConfig) setDefaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultInboxBatch
	}
	if c.Parallel <= 0 {
		c.Parallel = DefaultInboxParallel
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(10*time.Second, c.RetryMin)
	}
}

// InboxStore is what the inbox applies with: a docstore.Store.
type InboxStore interface {
	ApplyTx(ctx context.Context, tx pgx.Tx, writes []docstore.Write) ([]docstore.Outcome, error)
}

// Inbox applies the documents producers hand over in their own
// transactions (converge_inbox): each row is applied as the API applies
// PUT /v1/documents/{key} (or DELETE, withdraw true) and deleted in the
// same transaction, or, when the API would refuse it, kept with the
// refusal's code and message. Rows are taken with FOR UPDATE SKIP LOCKED,
// so that several writers drain at once and none takes a row another
// holds; a writer that dies mid-transaction leaves its rows untaken (its
// transaction is rolled back) for the next. It drains when it starts,
// whenever it (re)connects, and when the trigger's notification says a
// producer committed, never on a timer.
type Inbox struct {
	pool    *pgxpool.Pool
	store   InboxStore
	cfg     InboxConfig
	metrics *Metrics
	log     *slog.Logger

	mu         sync.Mutex
	unreadable map[string]*unreadableSource // sources whose view could not be read, by name
}

// unreadableSource is a source whose view could not be read: its rows
// are left out of the batches until it is tried again.
type unreadableSource struct {
	attempts int
	retry    time.Time
}

// NewInbox returns the inbox's drain over pool.
func NewInbox(pool *pgxpool.Pool, store InboxStore, cfg InboxConfig, metrics *Metrics, log *slog.Logger) *Inbox {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &Inbox{pool: pool, store: store, cfg: cfg, metrics: metrics, log: log}
}

// Run drains the inbox until ctx ends: after LISTEN on a connection of
// its own, and then each time a notification arrives. A failure (the
// database gone) is logged and retried with backoff; it returns nil when
// ctx ends.
func (in *Inbox) Run(ctx context.Context) error {
	backoff := retry.Backoff{Min: in.cfg.RetryMin, Max: in.cfg.RetryMax}
	for attempt := 0; ; attempt++ {
		err := in.listen(ctx, func() { attempt = 0 })
		if ctx.Err() != nil {
			return nil
		}
		in.log.Warn("inbox: draining stopped; retrying", "err", err, "attempt", attempt+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff.Delay(attempt)):
		}
	}
}

// listen holds one connection listening on InboxChannel and drains after
// LISTEN (what committed before it is not notified to it) and after every
// notification.
func (in *Inbox) listen(ctx context.Context, healthy func()) error {
	conn, err := in.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection's session listens: it leaves the pool for good.
	listener := conn.Hijack()
	defer listener.Close(context.Background()) //nolint:errcheck // closing a connection being given up
	if _, err := listener.Exec(ctx, "LISTEN "+InboxChannel); err != nil {
		return fmt.Errorf("inbox: listen: %w", err)
	}
	for {
		if _, err := in.Drain(ctx); err != nil {
			return err
		}
		healthy()
		// A source left out until a time is tried again then, whether or
		// not a producer commits meanwhile.
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if next, ok := in.nextRetry(); ok {
			wctx, cancel = context.WithDeadline(ctx, next)
		}
		_, err := listener.WaitForNotification(wctx)
		retryDue := ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) && pgconn.Timeout(err)
		cancel()
		if err != nil && !retryDue {
			return fmt.Errorf("inbox: wait for a notification: %w", err)
		}
	}
}

// Drain applies what is pending in the inbox, a batch per transaction,
// Parallel transactions at once, each until its batch finds fewer rows
// than it may take; it returns how many rows it took (applied or
// refused).
func (in *Inbox) Drain(ctx context.Context) (int, error) {
	var total atomic.Int64
	var g errgroup.Group
	for range in.cfg.Parallel {
		g.Go(func() error {
			for {
				n, err := in.drainBatch(ctx)
				total.Add(int64(n))
				if errors.Is(err, errBlocked) {
					// Rows wait for a source that cannot be read: the
					// others go on, and they at its next attempt.
					if n == 0 {
						return nil
					}
					continue
				}
				if errors.Is(err, errDeferred) {
					// What it waits for is another transaction's: soon
					// committed.
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				if err != nil || n < in.cfg.BatchSize {
					return err
				}
			}
		})
	}
	err := g.Wait()
	return int(total.Load()), err
}

// inboxRow is one row taken from the inbox: a document handed over, or
// (source set) a changed row of a mapped table.
type inboxRow struct {
	id          int64
	key         string
	document    []byte
	source, row string
}

const takeInboxSQL = `SELECT id, coalesce(key, ''), coalesce(document::text, ''), coalesce(source, ''), coalesce(row_id, '')
FROM converge_inbox WHERE refused_at IS NULL AND coalesce(source, '') <> ALL($2::text[]) ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`

// setUnreadable leaves the source of e out until its next attempt.
func (in *Inbox) setUnreadable(e *UnreadableSourceError) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.unreadable == nil {
		in.unreadable = map[string]*unreadableSource{}
	}
	u := in.unreadable[e.Source]
	if u == nil {
		u = &unreadableSource{}
		in.unreadable[e.Source] = u
	} else if time.Now().Before(u.retry) {
		return // another of this writer's batches failed on it first: one attempt
	}
	u.attempts++
	delay := retry.Backoff{Min: in.cfg.RetryMin, Max: in.cfg.RetryMax}.Delay(u.attempts)
	u.retry = time.Now().Add(delay)
	in.metrics.InboxSourceUnreadable.WithLabelValues(e.Source).Set(1)
	in.log.Error(e.Error(), "source", e.Source, "code", e.Err.Code, "attempt", u.attempts, "again_in", delay.Round(time.Millisecond))
}

// readable notes that the sources of a committed batch were read.
func (in *Inbox) readable(changes []*sourceChange) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, c := range changes {
		if _, ok := in.unreadable[c.source]; ok {
			delete(in.unreadable, c.source)
			in.metrics.InboxSourceUnreadable.WithLabelValues(c.source).Set(0)
			in.log.Info("inbox: source's view read again: its pending rows are applied", "source", c.source)
		}
	}
}

// leftOut are the sources whose rows the batches leave out now.
func (in *Inbox) leftOut() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := []string{}
	now := time.Now()
	for name, u := range in.unreadable {
		if now.Before(u.retry) {
			out = append(out, name)
		}
	}
	return out
}

// nextRetry is when the first source left out is tried again; a source
// whose time has passed is in the batches already (its rows, if another
// writer did not take them).
func (in *Inbox) nextRetry() (time.Time, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var next time.Time
	now := time.Now()
	for _, u := range in.unreadable {
		if u.retry.After(now) && (next.IsZero() || u.retry.Before(next)) {
			next = u.retry
		}
	}
	return next, !next.IsZero()
}

// drainBatch takes up to a batch of pending rows, applies them, deletes
// the applied ones and marks the refused ones, in one transaction. The
// rows of a source whose view cannot be read are left pending, and the
// source out of the next batches until it is tried again (after a
// backoff); so is a row that must settle a key with one of its rows.
func (in *Inbox) drainBatch(ctx context.Context) (int, error) {
	start := time.Now()
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit, a no-op
	rows, err := tx.Query(ctx, takeInboxSQL, in.cfg.BatchSize, in.leftOut())
	if err != nil {
		return 0, fmt.Errorf("inbox: take: %w", err)
	}
	taken, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inboxRow, error) {
		var row inboxRow
		var doc string
		err := r.Scan(&row.id, &row.key, &doc, &row.source, &row.row)
		row.document = []byte(doc)
		return row, err
	})
	if err != nil {
		return 0, fmt.Errorf("inbox: take: %w", err)
	}
	if len(taken) == 0 {
		return 0, nil
	}
	outs := make([]docstore.Outcome, len(taken))
	var writes []docstore.Write
	var at []int // the index in taken of each write
	changes := map[[2]string]*sourceChange{}
	var order []*sourceChange
	for i, row := range taken {
		if row.source != "" {
			c := changes[[2]string{row.source, row.row}]
			if c == nil {
				c = &sourceChange{source: row.source, row: row.row}
				changes[[2]string{row.source, row.row}] = c
				order = append(order, c)
			}
			c.at = append(c.at, i)
			continue
		}
		wr, err := decodeInbox(row)
		if err != nil {
			outs[i] = docstore.Outcome{Key: row.key, Err: err}
			continue
		}
		writes, at = append(writes, wr), append(at, i)
	}
	var pulled []*sourceChange
	if len(order) > 0 {
		// The rows' locks first, then their documents read; then every
		// key of the batch locked at once, in one order, before anything
		// is written.
		if err := lockSourceRows(ctx, tx, order); err != nil {
			return 0, err
		}
		if err := readSources(ctx, tx, order); err != nil {
			return 0, err
		}
		keys := sourceKeys(order)
		for _, w := range writes {
			keys = append(keys, w.Doc.Key)
		}
		slices.Sort(keys)
		if err := docstore.LockKeys(ctx, tx, slices.Compact(keys)); err != nil {
			return 0, fmt.Errorf("inbox: %w", err)
		}
	}
	// The documents handed over first, then the sources' rows, whose
	// versions follow what is stored then (a key handed over both ways in
	// one batch gets the row's document last, at the next version).
	applied, err := applyIsolatingTx(ctx, tx, in.store, writes)
	if err != nil {
		return 0, err
	}
	for j, o := range applied {
		outs[at[j]] = o
	}
	deferred := false
	if len(order) > 0 {
		if pulled, err = settleSources(ctx, tx, in.store, order); err != nil {
			return 0, err
		}
	}
	var settled []*sourceChange
	var blocked []*UnreadableSourceError
	for _, c := range append(order, pulled...) {
		if c.deferred {
			deferred = true
			if c.blocked != nil {
				blocked = append(blocked, c.blocked)
			}
			continue
		}
		for _, i := range c.at {
			outs[i] = docstore.Outcome{Key: c.key, Result: c.result, Err: c.err}
		}
		if c.err == nil {
			settled = append(settled, c)
		}
	}
	if err := finishSources(ctx, tx, settled); err != nil {
		return 0, err
	}
	var done, refusedIDs []int64
	var codes, messages []string
	left := map[int]bool{} // the rows of deferred changes: left pending
	for _, c := range order {
		if c.deferred {
			for _, i := range c.at {
				left[i] = true
			}
		}
	}
	for i, o := range outs {
		if left[i] {
			continue
		}
		if o.Err == nil {
			done = append(done, taken[i].id)
			continue
		}
		_, code := errorStatus(o.Err)
		refusedIDs, codes, messages = append(refusedIDs, taken[i].id), append(codes, code), append(messages, o.Err.Error())
	}
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM converge_inbox WHERE id = ANY($1)`, done); err != nil {
			return 0, fmt.Errorf("inbox: delete the applied rows: %w", err)
		}
	}
	if len(refusedIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE converge_inbox i SET refused_at = now(), refused_code = r.code, refused_message = r.message
			FROM unnest($1::int8[], $2::text[], $3::text[]) AS r(id, code, message) WHERE i.id = r.id`,
			refusedIDs, codes, messages); err != nil {
			return 0, fmt.Errorf("inbox: mark the refused rows: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("inbox: commit: %w", err)
	}
	in.metrics.TxSeconds.WithLabelValues("inbox").Observe(time.Since(start).Seconds())
	counted := make([]docstore.Outcome, 0, len(outs))
	for i, o := range outs {
		if !left[i] { // a row left pending has no outcome yet
			counted = append(counted, o)
		}
	}
	in.metrics.count("inbox", counted)
	in.readable(order)
	for i, id := range refusedIDs {
		in.metrics.InboxRefused.WithLabelValues(codes[i]).Inc()
		in.log.Warn("inbox: refused a handed-over row; it stays in converge_inbox with the reason", "id", id, "code", codes[i])
	}
	if len(blocked) > 0 {
		for _, ue := range blocked {
			in.setUnreadable(ue)
		}
		return len(taken) - len(left), errBlocked
	}
	if deferred {
		return len(taken), errDeferred
	}
	return len(taken), nil
}

// errBlocked is a batch that left rows for a source that cannot be read:
// they are taken again at its next attempt, not at once.
var errBlocked = errors.New("inbox: rows left until a source can be read")

// errDeferred is a batch that left rows for later: another transaction
// held what they need. The drain takes them again shortly.
var errDeferred = errors.New("inbox: rows left for another transaction to finish first")

// decodeInbox is the write a row hands over, validated as the API
// validates a PUT's body; {"version": N, "withdrawn": true} withdraws, as
// on the ingest subjects.
func decodeInbox(row inboxRow) (docstore.Write, error) {
	return decodeWrite(row.document, row.key, true)
}

// applyIsolatingTx is applyIsolating inside tx: each attempt in a
// savepoint, so that a write Postgres rejects (a permanent error) rolls
// back its part alone while the rest is applied.
func applyIsolatingTx(ctx context.Context, tx pgx.Tx, store InboxStore, writes []docstore.Write) ([]docstore.Outcome, error) {
	if len(writes) == 0 {
		return nil, nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("inbox: savepoint: %w", err)
	}
	outs, err := store.ApplyTx(ctx, sp, writes)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, fmt.Errorf("inbox: release savepoint: %w", err)
		}
		return outs, nil
	}
	if rerr := sp.Rollback(ctx); rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	switch {
	case !permanent(err):
		return nil, err
	case len(writes) == 1:
		return []docstore.Outcome{{Key: writes[0].Doc.Key, Version: writes[0].Doc.Version, Err: err}}, nil
	}
	mid := len(writes) / 2
	left, err := applyIsolatingTx(ctx, tx, store, writes[:mid])
	if err != nil {
		return nil, err
	}
	right, err := applyIsolatingTx(ctx, tx, store, writes[mid:])
	if err != nil {
		return nil, err
	}
	return append(left, right...), nil
}
