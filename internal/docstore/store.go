package docstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/pkg/contract"
)

// Result of writing one document version.
type Result string

// The results of a write that did not fail.
const (
	Applied   Result = "applied"   // stored; its event is in the outbox
	Unchanged Result = "unchanged" // this exact version was already stored
	Stale     Result = "stale"     // a newer version is stored; nothing written
)

// Write is one document version to store: an upsert, or a withdrawal when
// Withdraw is set (then only Key and Version are used).
type Write struct {
	Doc      contract.Document
	Withdraw bool
	// TraceParent is the W3C trace context of the request that wrote it,
	// stored with its outbox row ("" stores none).
	TraceParent string
}

// Outcome is the result of one [Write], in input order. Err is a
// *[contract.ValidationError] or a *[ConflictError]; the other writes of
// the batch are unaffected by it.
type Outcome struct {
	Key     string
	Version int64
	Result  Result
	EventID uuid.UUID
	Err     error
}

// Config of a [Store].
type Config struct {
	Chunking   chunking.Config
	MaxRetries int           // attempts after the first on a retryable error; default 8
	RetryBase  time.Duration // first backoff; doubles each attempt; default 5ms
}

func (c *Config) setDefaults() {
	if c.Chunking == (chunking.Config{}) {
		c.Chunking = chunking.DefaultConfig()
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 8
	}
	if c.RetryBase == 0 {
		c.RetryBase = 5 * time.Millisecond
	}
}

// Validate reports a configuration that cannot work. Zero fields take
// their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	if err := c.Chunking.Validate(); err != nil {
		return fmt.Errorf("docstore: %w", err)
	}
	if c.MaxRetries < 0 {
		return fmt.Errorf("docstore: MaxRetries must be >= 0, got %d", c.MaxRetries)
	}
	return nil
}

// Store writes and reads documents. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger
	// retries counts retried statements; exported through Retries.
	retries func()
	// traceColumn: the outbox has trace_context; traceCheck: when to look
	// again that it has not (unix nanoseconds, 0 before the first look).
	traceColumn atomic.Bool
	traceCheck  atomic.Int64
}

// New returns a Store over pool.
func New(pool *pgxpool.Pool, cfg Config, log *slog.Logger) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, cfg: cfg, log: log, retries: func() {}}, nil
}

// OnRetry sets a hook called once per retried statement (for metrics).
func (s *Store) OnRetry(f func()) { s.retries = f }

// Pool is the store's connection pool, for readiness checks.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// prepared is a validated write with everything derived from it.
type prepared struct {
	idx     int
	key     string
	version int64
	deleted bool
	title   string
	links   string // JSON array
	tags    string // JSON array
	meta    []byte
	hash    string
	event   contract.Event
	payload []byte // canonical event JSON, sent to the json column verbatim
	trace   string // traceparent, "" for none
}

// Prepare validates and derives one write: normalisation, chunking, the
// event and its canonical encoding. It touches no database.
func (s *Store) prepare(w Write) (prepared, error) {
	if w.Withdraw {
		if err := contract.ValidateKey(w.Doc.Key); err != nil {
			return prepared{}, err
		}
		if err := contract.ValidateVersion(w.Doc.Version); err != nil {
			return prepared{}, err
		}
		ev := contract.NewWithdrawnEvent(w.Doc.Key, w.Doc.Version)
		payload, err := ev.Encode()
		if err != nil {
			return prepared{}, fmt.Errorf("docstore: encode event: %w", err)
		}
		return prepared{key: ev.Key, version: ev.Version, deleted: true, links: "[]", tags: "[]", meta: []byte("{}"),
			hash: ev.ContentHash, event: ev, payload: payload}, nil
	}
	d, err := w.Doc.Normalize()
	if err != nil {
		return prepared{}, err
	}
	ev := contract.NewUpsertedEvent(d, chunking.Split(d.Body, s.cfg.Chunking))
	payload, err := ev.Encode()
	if err != nil {
		return prepared{}, fmt.Errorf("docstore: encode event: %w", err)
	}
	if len(payload) > contract.MaxEventBytes {
		return prepared{}, &contract.ValidationError{Code: contract.CodeEventTooLarge, Field: "body",
			Message: fmt.Sprintf("the document's event would be %d bytes, more than the limit of %d (JSON escaping of the body counts)", len(payload), contract.MaxEventBytes)}
	}
	links, _ := json.Marshal(d.Links)
	tags, _ := json.Marshal(d.Tags)
	return prepared{key: d.Key, version: d.Version, title: d.Title, links: string(links), tags: string(tags),
		meta: d.Meta, hash: ev.ContentHash, event: ev, payload: payload}, nil
}

// Put stores one document version.
func (s *Store) Put(ctx context.Context, d contract.Document) (Outcome, error) {
	out, err := s.Apply(ctx, []Write{{Doc: d}})
	if err != nil {
		return Outcome{}, err
	}
	return out[0], out[0].Err
}

// Withdraw stores a tombstone at version: the document disappears from every
// projection, and no upsert older than version can bring it back.
func (s *Store) Withdraw(ctx context.Context, key string, version int64) (Outcome, error) {
	out, err := s.Apply(ctx, []Write{{Doc: contract.Document{Key: key, Version: version}, Withdraw: true}})
	if err != nil {
		return Outcome{}, err
	}
	return out[0], out[0].Err
}

// Apply stores a batch of writes in one transaction and returns one outcome
// per write, in order. Invalid writes and conflicts are reported in their
// outcome and do not prevent the others; the returned error is for the
// batch as a whole (the database failed), in which case nothing was stored.
func (s *Store) Apply(ctx context.Context, writes []Write) ([]Outcome, error) {
	outs, rounds := s.prepareRounds(writes)
	if len(rounds) == 0 {
		return outs, nil
	}
	// Asked before any transaction holds a connection of the pool.
	traced := s.traced(ctx)
	err := s.retry(ctx, func() error {
		if len(rounds) == 1 {
			return s.applySingleRound(ctx, rounds[0], outs, traced)
		}
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return applyRounds(ctx, tx, rounds, outs, traced) })
	})
	if err != nil {
		return nil, err
	}
	return outs, nil
}

// ApplyTx is [Store.Apply] inside the caller's transaction tx, which it
// neither retries nor ends: what the writer applies together with its
// own changes to other tables (the inbox's rows it takes). An error
// leaves tx to be rolled back (or, inside a savepoint, the savepoint).
func (s *Store) ApplyTx(ctx context.Context, tx pgx.Tx, writes []Write) ([]Outcome, error) {
	outs, rounds := s.prepareRounds(writes)
	if len(rounds) == 0 {
		return outs, nil
	}
	// Asked in tx: the caller's transaction holds one of the pool's
	// connections already, and the pool may have no other.
	if err := applyRounds(ctx, tx, rounds, outs, s.tracedIn(ctx, tx)); err != nil {
		return nil, err
	}
	return outs, nil
}

// applyRounds locks the keys of every round and writes the rounds, in tx.
func applyRounds(ctx context.Context, tx pgx.Tx, rounds []round, outs []Outcome, traced bool) error {
	if _, err := tx.Exec(ctx, lockSQL, rounds[0].keys()); err != nil {
		return fmt.Errorf("docstore: lock keys: %w", err)
	}
	for _, r := range rounds {
		sql, args := applyStatement(r, traced)
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("docstore: apply: %w", err)
		}
		if err := finishRound(r, rows, outs); err != nil {
			return err
		}
	}
	return nil
}

// prepareRounds validates and derives every write: the outcome of each
// (its error, for an invalid one), and the valid ones in rounds of
// distinct keys, each sorted by key.
func (s *Store) prepareRounds(writes []Write) ([]Outcome, []round) {
	outs := make([]Outcome, len(writes))
	rounds := make([]round, 0, 1)
	seen := make(map[string]int, len(writes))
	for i, w := range writes {
		outs[i] = Outcome{Key: w.Doc.Key, Version: w.Doc.Version}
		p, err := s.prepare(w)
		if err != nil {
			outs[i].Err = err
			continue
		}
		p.idx = i
		p.trace = w.TraceParent
		outs[i].EventID = p.event.ID
		// ON CONFLICT cannot touch a row twice in one statement: the n-th
		// occurrence of a key goes into the n-th round.
		r := seen[p.key]
		seen[p.key] = r + 1
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], p)
	}
	for _, r := range rounds {
		// A consistent row lock order across concurrent batches.
		slices.SortFunc(r, func(a, b prepared) int { return strings.Compare(a.key, b.key) })
	}
	return outs, rounds
}

// applySQL writes a round; applySQLUntraced on an outbox without the
// trace_context column (a schema older than version 6).
var (
	applySQL         = fmt.Sprintf(applySQLTemplate, ", $19::text[]", ", trace_context", ", trace_context", ", nullif(i.trace_context, '')")
	applySQLUntraced = fmt.Sprintf(applySQLTemplate, "", "", "", "")
)

const applySQLTemplate = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::int8[], $3::bool[], $4::text[], $5::jsonb[], $6::jsonb[],
                         $7::text[], $8::text[], $9::int4[], $10::uuid[], $11::text[], $12::json[]%s)
        AS t(key, version, deleted, title, links, tags, meta, content_hash, chunk_count, event_id, kind, payload%s)
), doc AS (
    INSERT INTO documents AS d (key, version, deleted, title, links, tags, meta, meta_text, content_hash, chunk_count, updated_at)
    SELECT i.key, i.version, i.deleted, i.title,
           ARRAY(SELECT jsonb_array_elements_text(i.links)), ARRAY(SELECT jsonb_array_elements_text(i.tags)),
           i.meta::jsonb, i.meta, i.content_hash, i.chunk_count, now()
    FROM input i ORDER BY i.key
    ON CONFLICT (key) DO UPDATE
        SET version = excluded.version, deleted = excluded.deleted, title = excluded.title,
            links = excluded.links, tags = excluded.tags, meta = excluded.meta, meta_text = excluded.meta_text,
            content_hash = excluded.content_hash, chunk_count = excluded.chunk_count,
            updated_at = excluded.updated_at
        WHERE excluded.version > d.version
    RETURNING d.key
), del AS (
    DELETE FROM chunks c WHERE c.key = ANY (ARRAY(SELECT key FROM doc))
), ins AS (
    INSERT INTO chunks (id, key, version, ordinal, text, content_hash)
    SELECT c.id, c.key, c.version, c.ordinal, c.text, c.content_hash
    FROM unnest($13::uuid[], $14::text[], $15::int8[], $16::int4[], $17::text[], $18::text[])
        AS c(id, key, version, ordinal, text, content_hash)
    WHERE c.key IN (SELECT key FROM doc)
), ob AS (
    INSERT INTO outbox (event_id, key, version, kind, payload%s)
    SELECT i.event_id, i.key, i.version, i.kind, i.payload%s FROM input i
    WHERE i.key IN (SELECT key FROM doc)
)
-- One row per input: applied or not, and the row the freshness guard
-- compared against. This read sees the statement's snapshot, taken after
-- the key locks were granted, so it is exactly what the guard saw.
SELECT i.key, i.key IN (SELECT key FROM doc), d.version, d.deleted, d.content_hash
FROM input i LEFT JOIN documents d ON d.key = i.key`

// LockKeys takes in tx, for the rest of it, the locks every writer of
// documents takes on their keys before it reads or writes them (Apply and
// ApplyTx take them again, which costs nothing): what another writer
// reads of those documents after it is what tx will leave. Taken in one
// order, as Apply takes them.
func LockKeys(ctx context.Context, tx pgx.Tx, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, lockSQL, keys); err != nil {
		return fmt.Errorf("docstore: lock keys: %w", err)
	}
	return nil
}

// TryLockKey takes key's lock in tx as LockKeys does, if no other
// transaction holds it, and reports whether it did: for a lock taken out
// of LockKeys' order, which may not wait.
func TryLockKey(ctx context.Context, tx pgx.Tx, key string) (bool, error) {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+keyLockClass+`, hashtext($1))`, key).Scan(&ok); err != nil {
		return false, fmt.Errorf("docstore: lock key: %w", err)
	}
	return ok, nil
}

// keyLockClass is the advisory lock class of the documents' keys,
// 0x434F4E56 ("CONV"), as SQL.
const keyLockClass = "1129270870"

// lockSQL serialises writers of the same keys for the rest of the
// transaction. Without it, two concurrent writes of one key could each take
// their snapshot before the other committed, and the later one would
// delete only the chunks it saw, leaving the other version's chunks behind.
// Locks are taken in one order (by hash), so writers cannot deadlock on
// them; the advisory class 0x434F4E56 ("CONV") keeps them apart from other
// applications' advisory locks, and a hash collision only serialises two
// unrelated keys.
const lockSQL = `
SELECT pg_advisory_xact_lock(` + keyLockClass + `, h)
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($1::text[]) AS k) l
ORDER BY h`

// round is a set of writes with distinct keys: one statement.
type round []prepared

// keys are the round's keys; the first round holds every key of a batch.
func (r round) keys() []string {
	keys := make([]string, len(r))
	for i, p := range r {
		keys[i] = p.key
	}
	return keys
}

// applyStatement is the statement that writes round r, and its
// parameters: without the trace contexts on an outbox that has no column
// for them (traced false).
func applyStatement(r round, traced bool) (string, []any) {
	args := r.args()
	if !traced {
		return applySQLUntraced, args[:len(args)-1]
	}
	return applySQL, args
}

// traced reports whether the outbox has the trace_context column (schema
// version 6). A writer newer than its schema keeps writing, without the
// trace contexts, until `converge migrate up`: it looks again a minute
// later.
func (s *Store) traced(ctx context.Context) bool { return s.tracedIn(ctx, s.pool) }

// rowQuerier is a pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// tracedIn is traced, asked of q.
func (s *Store) tracedIn(ctx context.Context, q rowQuerier) bool {
	if s.traceColumn.Load() {
		return true
	}
	now := time.Now().UnixNano()
	if next := s.traceCheck.Load(); next != 0 && now < next {
		return false
	}
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_attribute
		WHERE attrelid = 'outbox'::regclass AND attname = 'trace_context' AND NOT attisdropped)`).Scan(&ok)
	if err != nil {
		return false // the write itself will meet the failure
	}
	if ok {
		s.traceColumn.Store(true)
		return true
	}
	if s.traceCheck.Swap(now+int64(time.Minute)) == 0 {
		s.log.Warn("the outbox has no trace_context column (schema older than version 6): trace contexts are not stored; run `converge migrate up`")
	}
	return false
}

// args are the parameters of applySQL for the round (applySQLUntraced
// takes all but the last).
func (r round) args() []any {
	n := len(r)
	var (
		keys, titles, hashes, kinds = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		links, tags                 = make([]string, n), make([]string, n)
		metas                       = make([]string, n)
		payloads                    = make([][]byte, n)
		versions                    = make([]int64, n)
		deleted                     = make([]bool, n)
		counts                      = make([]int32, n)
		eventIDs                    = make([]uuid.UUID, n)
		traces                      = make([]string, n)
		chunks                      int
	)
	for _, p := range r {
		chunks += len(p.event.Chunks)
	}
	var (
		cIDs                   = make([]uuid.UUID, 0, chunks)
		cKeys, cTexts, cHashes = make([]string, 0, chunks), make([]string, 0, chunks), make([]string, 0, chunks)
		cVersions              = make([]int64, 0, chunks)
		cOrdinals              = make([]int32, 0, chunks)
	)
	for i, p := range r {
		keys[i], versions[i], deleted[i], titles[i] = p.key, p.version, p.deleted, p.title
		links[i], tags[i], metas[i], hashes[i] = p.links, p.tags, string(p.meta), p.hash
		counts[i], eventIDs[i], kinds[i], payloads[i] = int32(len(p.event.Chunks)), p.event.ID, string(p.event.Kind), p.payload
		traces[i] = p.trace
		for _, c := range p.event.Chunks {
			cIDs = append(cIDs, c.ID)
			cKeys = append(cKeys, p.key)
			cVersions = append(cVersions, p.version)
			cOrdinals = append(cOrdinals, int32(c.Ordinal))
			cTexts = append(cTexts, c.Text)
			cHashes = append(cHashes, c.Hash)
		}
	}
	return []any{keys, versions, deleted, titles, links, tags, metas, hashes, counts,
		eventIDs, kinds, payloads, cIDs, cKeys, cVersions, cOrdinals, cTexts, cHashes, traces}
}

// applySingleRound sends the key locks and the write statement in one
// pipeline. pgx sends a batch with a single Sync, so both run in one
// implicit transaction: the locks are held until the write commits, and
// the write's snapshot is taken after they were granted.
func (s *Store) applySingleRound(ctx context.Context, r round, outs []Outcome, traced bool) error {
	b := &pgx.Batch{}
	b.Queue(lockSQL, r.keys())
	sql, args := applyStatement(r, traced)
	b.Queue(sql, args...)
	br := s.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("docstore: lock keys: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return fmt.Errorf("docstore: apply: %w", err)
	}
	results, err := collectResults(rows)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("docstore: apply: %w", err)
	}
	return classify(r, results, outs)
}

// finishRound classifies a round run inside a transaction.
func finishRound(r round, rows pgx.Rows, outs []Outcome) error {
	results, err := collectResults(rows)
	if err != nil {
		return fmt.Errorf("docstore: apply: %w", err)
	}
	return classify(r, results, outs)
}

// roundResult is what the write statement reports for one input key.
type roundResult struct {
	applied bool
	version *int64 // the stored row before the statement; nil for a new key
	deleted *bool
	hash    *string
}

func collectResults(rows pgx.Rows) (map[string]roundResult, error) {
	results := make(map[string]roundResult)
	var (
		k   string
		res roundResult
	)
	_, err := pgx.ForEachRow(rows, []any{&k, &res.applied, &res.version, &res.deleted, &res.hash}, func() error {
		results[k] = res
		res = roundResult{}
		return nil
	})
	return results, err
}

// classify fills in outs for a round from the statement's own report:
// applied, or for the others stale, unchanged or a conflict against the
// row the guard compared with. It is part of the write, so a result is
// never reported for a state other than the one written against.
func classify(round round, results map[string]roundResult, outs []Outcome) error {
	for _, p := range round {
		res, ok := results[p.key]
		switch {
		case !ok:
			return fmt.Errorf("docstore: no result for %q", p.key)
		case res.applied:
			outs[p.idx].Result, outs[p.idx].Err = Applied, nil
		case res.version == nil:
			return fmt.Errorf("docstore: %q was neither applied nor found", p.key)
		case *res.version > p.version:
			outs[p.idx].Result, outs[p.idx].Err = Stale, nil
		case *res.version == p.version && *res.hash == p.hash:
			outs[p.idx].Result, outs[p.idx].Err = Unchanged, nil
		case *res.version == p.version:
			outs[p.idx].Err = &ConflictError{Key: p.key, Version: p.version, StoredHash: *res.hash, IncomingHash: p.hash, StoredDeleted: *res.deleted}
		default:
			return fmt.Errorf("docstore: %q stored at version %d, older than %d, yet not applied", p.key, *res.version, p.version)
		}
	}
	return nil
}

// retry runs f until it succeeds, fails with an error that is not
// retryable, or the attempts or ctx run out.
func (s *Store) retry(ctx context.Context, f func() error) error {
	delay := s.cfg.RetryBase
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || attempt >= s.cfg.MaxRetries || !Retryable(err) {
			return err
		}
		s.retries()
		s.log.DebugContext(ctx, "retrying write", "attempt", attempt+1, "err", err)
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// Retryable reports whether err is a transient database error after which
// the same statement may simply run again: serialization failure, deadlock,
// or a failure pgconn knows happened before anything was sent.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return true
		}
		return false
	}
	return pgconn.SafeToRetry(err)
}
