package docstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// Reemission is one document whose current version was written to the
// outbox again.
type Reemission struct {
	Key      string
	Version  int64
	EventID  uuid.UUID
	Emission int64 // the outbox row's emission number, > 0
}

// Reemitted is the outcome of [Store.Reemit] and [Store.ReemitAll].
type Reemitted struct {
	Reemitted []Reemission // in key order
	NotFound  []string     // keys with no document, in the order given
}

// Reemit writes the event of the current version of each key to the
// outbox again, so that the relay publishes it again and the projections
// rewrite it: the repair of a projection damaged behind its projector's
// back. The keys are handled in one transaction; a key without a document
// is reported in NotFound and does not affect the others. A document whose
// stored rows do not rebuild its original event fails the call with a
// [*NotReproducibleError] naming it, and nothing is written.
//
// # Write order
//
// In one transaction:
//
//  1. the key locks every write takes (pg_advisory_xact_lock on each key's
//     hash, in hash order), so that no write of these keys commits between
//     the read and the outbox rows, and the re-emission sits in the WAL
//     after every write it read and before every later one;
//  2. the documents and their chunks are read, and each event is rebuilt
//     with pkg/contract (the chunks' texts in ordinal order, or the
//     withdrawal) and checked against the stored content hash and chunk
//     ids;
//  3. the outbox rows of those events are deleted (the publication does not
//     publish deletes) and inserted again, with the canonical event and
//     emission = nextval('outbox_emission_seq').
//
// A crash before the commit leaves nothing; after it, the new outbox rows
// are relayed like any others.
func (s *Store) Reemit(ctx context.Context, keys []string) (Reemitted, error) {
	keys = distinctKeys(keys)
	for _, k := range keys {
		if err := contract.ValidateKey(k); err != nil {
			return Reemitted{}, err
		}
	}
	if len(keys) == 0 {
		return Reemitted{}, nil
	}
	var out Reemitted
	traced := s.traced(ctx) // before the transaction holds a connection
	err := s.retry(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var err error
			out, err = s.reemitTx(ctx, tx, keys, traced)
			return err
		})
	})
	if err != nil {
		return Reemitted{}, err
	}
	return out, nil
}

// ReemitAll re-emits, as [Store.Reemit] does, up to limit documents whose
// keys sort after `after` ("" to start), in key order (the database's
// collation, as its primary key). next is the key to continue after, or ""
// when no document is left.
func (s *Store) ReemitAll(ctx context.Context, after string, limit int) (_ Reemitted, next string, _ error) {
	if limit <= 0 {
		return Reemitted{}, "", fmt.Errorf("docstore: re-emission limit must be > 0, got %d", limit)
	}
	var out Reemitted
	traced := s.traced(ctx) // before the transaction holds a connection
	err := s.retry(ctx, func() error {
		next = ""
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, `SELECT key FROM documents WHERE key > $1 ORDER BY key LIMIT $2`, after, limit+1)
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("docstore: list documents: %w", err)
			}
			if len(keys) > limit {
				keys = keys[:limit]
				next = keys[limit-1]
			}
			if len(keys) == 0 {
				out = Reemitted{}
				return nil
			}
			out, err = s.reemitTx(ctx, tx, keys, traced)
			return err
		})
	})
	if err != nil {
		return Reemitted{}, "", err
	}
	return out, next, nil
}

func distinctKeys(keys []string) []string {
	seen := make(map[string]struct{}, len(keys))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

const reemitDocumentsSQL = `
SELECT key, version, deleted, title, links, tags, coalesce(meta_text, meta::text), content_hash, chunk_count
FROM documents WHERE key = ANY ($1::text[])`

const reemitChunksSQL = `
SELECT key, id, version, ordinal, text FROM chunks WHERE key = ANY ($1::text[]) ORDER BY key, ordinal`

// reemitOriginalsSQL reads the outbox rows still present of the given
// events: the original encoding, when the stored rows do not rebuild it.
const reemitOriginalsSQL = `SELECT event_id, payload::text FROM outbox WHERE event_id = ANY ($1::uuid[])`

const reemitDeleteSQL = `DELETE FROM outbox WHERE event_id = ANY ($1::uuid[])`

// reemitInsertSQL writes the re-emitted rows; reemitInsertUntracedSQL on
// an outbox without trace_context (schema older than version 6).
const (
	reemitInsertSQL = `
INSERT INTO outbox (event_id, key, version, kind, payload, emission, trace_context)
SELECT e.event_id, e.key, e.version, e.kind, e.payload, nextval('outbox_emission_seq'), nullif($6::text, '')
FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::json[]) AS e(event_id, key, version, kind, payload)
RETURNING key, emission`
	reemitInsertUntracedSQL = `
INSERT INTO outbox (event_id, key, version, kind, payload, emission)
SELECT e.event_id, e.key, e.version, e.kind, e.payload, nextval('outbox_emission_seq')
FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::json[]) AS e(event_id, key, version, kind, payload)
RETURNING key, emission`
)

// storedDocument is a document's row and its chunks, as read for a
// re-emission.
type storedDocument struct {
	key, title, hash string
	version          int64
	deleted          bool
	links, tags      []string
	meta             string
	chunkCount       int
	chunks           []storedChunk
}

type storedChunk struct {
	id      uuid.UUID
	version int64
	ordinal int
	text    string
}

// reemitTx is one re-emission transaction over keys (distinct, valid).
func (s *Store) reemitTx(ctx context.Context, tx pgx.Tx, keys []string, traced bool) (Reemitted, error) {
	if _, err := tx.Exec(ctx, lockSQL, keys); err != nil {
		return Reemitted{}, fmt.Errorf("docstore: lock keys: %w", err)
	}
	docs, err := readStored(ctx, tx, keys)
	if err != nil {
		return Reemitted{}, err
	}
	var out Reemitted
	events := make([]contract.Event, 0, len(docs))
	var unmatched []int // events whose rebuilt content hash is not the stored one
	for _, k := range keys {
		d, ok := docs[k]
		if !ok {
			out.NotFound = append(out.NotFound, k)
			continue
		}
		ev, err := d.event()
		if err != nil {
			return Reemitted{}, err
		}
		if ev.ContentHash != d.hash {
			unmatched = append(unmatched, len(events))
		}
		events = append(events, ev)
	}
	if len(events) == 0 {
		return out, nil
	}
	payloads := make([][]byte, len(events))
	for i, ev := range events {
		if payloads[i], err = ev.Encode(); err != nil {
			return Reemitted{}, fmt.Errorf("docstore: encode event of %q: %w", ev.Key, err)
		}
	}
	if len(unmatched) > 0 {
		if err := useOriginals(ctx, tx, docs, events, payloads, unmatched); err != nil {
			return Reemitted{}, err
		}
	}

	n := len(events)
	ids, eventKeys, kinds := make([]uuid.UUID, n), make([]string, n), make([]string, n)
	versions := make([]int64, n)
	for i, ev := range events {
		ids[i], eventKeys[i], versions[i], kinds[i] = ev.ID, ev.Key, ev.Version, string(ev.Kind)
	}
	if _, err := tx.Exec(ctx, reemitDeleteSQL, ids); err != nil {
		return Reemitted{}, fmt.Errorf("docstore: re-emit: delete outbox rows: %w", err)
	}
	// The re-emission continues the trace of the request that asked for it.
	var rows pgx.Rows
	if traced {
		rows, _ = tx.Query(ctx, reemitInsertSQL, ids, eventKeys, versions, kinds, payloads, telemetry.TraceParent(ctx))
	} else {
		rows, _ = tx.Query(ctx, reemitInsertUntracedSQL, ids, eventKeys, versions, kinds, payloads)
	}
	emissions := make(map[string]int64, n)
	var (
		key      string
		emission int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &emission}, func() error {
		emissions[key] = emission
		return nil
	}); err != nil {
		return Reemitted{}, fmt.Errorf("docstore: re-emit: insert outbox rows: %w", err)
	}
	for _, ev := range events {
		e, ok := emissions[ev.Key]
		if !ok {
			return Reemitted{}, fmt.Errorf("docstore: re-emit: no outbox row returned for %q", ev.Key)
		}
		out.Reemitted = append(out.Reemitted, Reemission{Key: ev.Key, Version: ev.Version, EventID: ev.ID, Emission: e})
	}
	slices.SortFunc(out.Reemitted, func(a, b Reemission) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// readStored reads the documents of keys and their chunks, by key.
func readStored(ctx context.Context, tx pgx.Tx, keys []string) (map[string]*storedDocument, error) {
	docs := make(map[string]*storedDocument, len(keys))
	rows, _ := tx.Query(ctx, reemitDocumentsSQL, keys)
	var d storedDocument
	if _, err := pgx.ForEachRow(rows, []any{&d.key, &d.version, &d.deleted, &d.title, &d.links, &d.tags, &d.meta, &d.hash, &d.chunkCount}, func() error {
		c := d
		docs[c.key] = &c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("docstore: re-emit: read documents: %w", err)
	}
	rows, _ = tx.Query(ctx, reemitChunksSQL, keys)
	var (
		key string
		c   storedChunk
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &c.id, &c.version, &c.ordinal, &c.text}, func() error {
		if d := docs[key]; d != nil {
			d.chunks = append(d.chunks, c)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("docstore: re-emit: read chunks: %w", err)
	}
	return docs, nil
}

// event rebuilds the event of the stored version: the withdrawal, or the
// upsert whose chunks are the stored chunks' texts in ordinal order. The
// chunks must be exactly those of the version (ordinals 0..n-1, the
// version's derived ids, as many as the document counts); the content
// hash is compared by the caller.
func (d *storedDocument) event() (contract.Event, error) {
	fail := func(format string, args ...any) error {
		return &NotReproducibleError{Key: d.key, Version: d.version, Reason: fmt.Sprintf(format, args...)}
	}
	if d.deleted {
		if len(d.chunks) > 0 {
			return contract.Event{}, fail("a withdrawal with %d stored chunks", len(d.chunks))
		}
		return contract.NewWithdrawnEvent(d.key, d.version), nil
	}
	if len(d.chunks) != d.chunkCount {
		return contract.Event{}, fail("%d chunks stored, the document counts %d", len(d.chunks), d.chunkCount)
	}
	texts := make([]string, len(d.chunks))
	var body strings.Builder
	for i, c := range d.chunks {
		if c.ordinal != i || c.version != d.version || c.id != contract.ChunkID(d.key, d.version, i) {
			return contract.Event{}, fail("stored chunk %d (ordinal %d, version %d, id %s) is not chunk %d of the version", i, c.ordinal, c.version, c.id, i)
		}
		texts[i] = c.text
		body.WriteString(c.text)
	}
	doc, err := contract.Document{Key: d.key, Version: d.version, Title: d.title, Body: body.String(),
		Links: d.links, Tags: d.tags, Meta: []byte(d.meta)}.Normalize()
	if err != nil {
		return contract.Event{}, fail("the stored document does not validate: %v", err)
	}
	return contract.NewUpsertedEvent(doc, texts), nil
}

// useOriginals replaces the rebuilt events whose content hash is not the
// stored one (events[i] for i in unmatched) by their original encoding,
// when the outbox still holds it and it verifies against the stored hash.
// Meta is stored as jsonb, which keeps numbers' values but not always
// their spelling (1e2 reads back as 100), and since schema version 3 also
// as the event's text (meta_text), from which the event is rebuilt. A row
// written before then has only the jsonb, so such a document rebuilds
// another content hash than the one its event carried. Without its
// original, the document cannot be re-emitted: a [*NotReproducibleError].
func useOriginals(ctx context.Context, tx pgx.Tx, docs map[string]*storedDocument, events []contract.Event, payloads [][]byte, unmatched []int) error {
	ids := make([]uuid.UUID, len(unmatched))
	for j, i := range unmatched {
		ids[j] = events[i].ID
	}
	rows, _ := tx.Query(ctx, reemitOriginalsSQL, ids)
	originals := make(map[uuid.UUID]string, len(ids))
	var (
		id      uuid.UUID
		payload string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
		originals[id] = payload
		return nil
	}); err != nil {
		return fmt.Errorf("docstore: re-emit: read outbox: %w", err)
	}
	var errs []error
	for _, i := range unmatched {
		ev := events[i]
		d := docs[ev.Key]
		if p, ok := originals[ev.ID]; ok {
			orig, err := contract.DecodeEvent([]byte(p))
			if err == nil && orig.ID == ev.ID && orig.ContentHash == d.hash {
				events[i], payloads[i] = orig, []byte(p)
				continue
			}
		}
		errs = append(errs, &NotReproducibleError{Key: d.key, Version: d.version,
			Reason: fmt.Sprintf("the stored rows rebuild content hash %.12s, the stored hash is %.12s, and the original event is no longer in the outbox", ev.ContentHash, d.hash)})
	}
	return errors.Join(errs...)
}
