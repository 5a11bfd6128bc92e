package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/pkg/contract"
)

// The codes of a handed-over row of a source the writer refuses (beside
// the document's own validation codes).
const (
	CodeUnknownSource = "unknown_source"
	CodeDuplicateKey  = "duplicate_key"
	CodeRowTwice      = "row_twice"
	CodeRowUnreadable = "row_unreadable"
)

// sourceLockClass is the advisory lock class of the sources' rows
// ("SOUR"), apart from the documents' key locks (docstore's "CONV") and
// from other applications' advisory locks.
const sourceLockClass int32 = 0x534F5552

// sourceChange is one changed row of a source, as handed over (perhaps
// several times: at indexes at of the batch).
type sourceChange struct {
	source, row string
	at          []int

	err      error                  // a refusal
	deferred bool                   // left for a later batch: another transaction holds what it needs
	blocked  *UnreadableSourceError // deferred because its source's view cannot be read
	now      *viewRow               // the row's document now; nil: none
	doc      contract.Document      // now's document, normalised
	before   string                 // the key the row gave before; "" for none
	writes   []docstore.Write       // what applying it writes (none: unchanged)
	key      string                 // the key its row gives now; "" for none
	result   docstore.Result
}

func (c *sourceChange) self() [2]string { return [2]string{c.source, c.row} }

// sourceRowLock is the number of a source's row's advisory lock, in
// class sourceLockClass.
func sourceRowLock(source, row string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(source + "\x00" + row)) // a hash.Hash never fails
	return int32(h.Sum32())                       //nolint:gosec // a lock's number: any 32 bits
}

// viewRow is a row of a source's view.
type viewRow struct {
	key, title, body string
	tags, links      []string
	meta             string
}

type docState struct {
	version int64
	deleted bool
	hash    string
}

// lockSourceRows takes the changed rows' locks, in one order, for the
// rest of tx: two writers holding changes of one row apply them one after
// the other, and each reads (in a later statement) what committed before
// it, so that versions follow the commits. Taken first in a batch, before
// any document's key lock.
func lockSourceRows(ctx context.Context, tx pgx.Tx, changes []*sourceChange) error {
	locks := make([]int32, 0, len(changes))
	for _, c := range changes {
		locks = append(locks, sourceRowLock(c.source, c.row))
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock($1, l)) FROM unnest($2::int4[]) AS l`, sourceLockClass, locks); err != nil {
		return fmt.Errorf("inbox: lock the sources' rows: %w", err)
	}
	return nil
}

// readSources reads, in tx (the rows locked), the document each changed
// row gives now (validated) and the key it gave before.
func readSources(ctx context.Context, tx pgx.Tx, changes []*sourceChange) error {
	bySource := map[string][]*sourceChange{}
	var names []string
	for _, c := range changes {
		if _, ok := bySource[c.source]; !ok {
			names = append(names, c.source)
		}
		bySource[c.source] = append(bySource[c.source], c)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := readSource(ctx, tx, name, bySource[name]); err != nil {
			return err
		}
	}
	for _, c := range changes {
		if c.err != nil || c.now == nil {
			continue
		}
		d := contract.Document{Key: c.now.key, Version: 1, Title: c.now.title, Body: c.now.body,
			Tags: c.now.tags, Links: c.now.links, Meta: json.RawMessage(c.now.meta)}
		norm, err := d.Normalize()
		if err != nil {
			c.err = err
			continue
		}
		c.doc, c.key = norm, norm.Key
	}
	return nil
}

// sourceKeys are the keys the changes give now and gave before.
func sourceKeys(changes []*sourceChange) []string {
	var keys []string
	for _, c := range changes {
		if c.err != nil {
			continue
		}
		if c.key != "" {
			keys = append(keys, c.key)
		}
		if c.before != "" {
			keys = append(keys, c.before)
		}
	}
	return keys
}

// settleSources decides and applies, in tx (the rows and their keys
// locked), the changes' writes: an upsert at the next version of a key
// whose content changed, a withdrawal of the key a row gave before when it
// gives none now or another one (unless another row takes it). Which row
// gives each key is settled first: a key a row of the batch gives up is
// free for the batch's others; a key a row outside the batch is recorded
// with is taken from it when that row no longer gives it (its change is
// then applied here too: pulled into the batch), and refused as a
// duplicate when it does. Every change's writes are applied together in a
// savepoint: when one is refused (its document too large, say), all are
// rolled back, it is refused, and the rest settled again, so that no key
// is released by a change that is not applied. It returns the changes
// pulled in.
func settleSources(ctx context.Context, tx pgx.Tx, store InboxStore, changes []*sourceChange) ([]*sourceChange, error) {
	var pulled []*sourceChange
	for {
		all := append(slices.Clone(changes), pulled...)
		again, more, err := settleOwners(ctx, tx, all)
		if err != nil {
			return nil, err
		}
		if again {
			pulled = append(pulled, more...)
			continue
		}
		docs, err := readDocs(ctx, tx, sourceKeys(all))
		if err != nil {
			return nil, err
		}
		takenBy := map[string]*sourceChange{}
		for _, c := range all {
			if active(c) && c.key != "" {
				takenBy[c.key] = c
			}
		}
		var writes []docstore.Write
		var of []*sourceChange
		for _, c := range all {
			c.writes = nil
			if !active(c) {
				continue
			}
			decide(c, takenBy, docs)
			for _, w := range c.writes {
				writes, of = append(writes, w), append(of, c)
			}
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("inbox: savepoint: %w", err)
		}
		outs, err := applyIsolatingTx(ctx, sp, store, writes)
		if err != nil {
			return nil, err
		}
		refused := false
		for j, o := range outs {
			if o.Err != nil && of[j].err == nil {
				of[j].err, refused = o.Err, true
			}
		}
		if !refused {
			if err := sp.Commit(ctx); err != nil {
				return nil, fmt.Errorf("inbox: release savepoint: %w", err)
			}
			return pulled, nil
		}
		if err := sp.Rollback(ctx); err != nil {
			return nil, fmt.Errorf("inbox: roll back to savepoint: %w", err)
		}
	}
}

func active(c *sourceChange) bool { return c.err == nil && !c.deferred }

// settleOwners settles which change gives each key, refusing duplicates;
// again reports that it must run again (a refusal took a release back,
// or a row outside the batch was pulled in: more).
func settleOwners(ctx context.Context, tx pgx.Tx, all []*sourceChange) (again bool, more []*sourceChange, err error) {
	owners, err := readOwners(ctx, tx, sourceKeys(all))
	if err != nil {
		return false, nil, err
	}
	inBatch := map[[2]string]*sourceChange{}
	for _, c := range all {
		inBatch[c.self()] = c
	}
	for _, c := range all {
		if active(c) && c.before != "" && c.before != c.key && owners[c.before] == c.self() {
			delete(owners, c.before)
		}
	}
	for _, c := range all {
		if !active(c) || c.key == "" {
			continue
		}
		o, ok := owners[c.key]
		if !ok || o == c.self() {
			owners[c.key] = c.self()
			continue
		}
		if d := inBatch[o]; d != nil {
			if d.deferred {
				// It may give the key up once it can be applied: wait
				// with it.
				c.deferred = true
				return true, nil, nil
			}
			// A row of the batch that keeps the key, or one refused:
			// a duplicate.
			c.err = &contract.ValidationError{Code: CodeDuplicateKey, Field: "key",
				Message: fmt.Sprintf("row %s of source %s gives key %q, which row %s of source %s gives already", c.row, c.source, c.key, o[1], o[0])}
			return true, nil, nil
		}
		// Recorded for a row outside the batch: pulled in, if nothing
		// else holds it; its change settles the key.
		p, err := pull(ctx, tx, o)
		if err != nil {
			return false, nil, err
		}
		if p == nil {
			c.deferred = true
			return true, nil, nil
		}
		return true, []*sourceChange{p}, nil
	}
	return false, nil, nil
}

// pull takes row o's lock without waiting (its lock is out of the
// batch's order) and reads its change as the batch's are read, with the
// key it gives now locked the same way; nil when another transaction
// holds either.
func pull(ctx context.Context, tx pgx.Tx, o [2]string) (*sourceChange, error) {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2)`, sourceLockClass, sourceRowLock(o[0], o[1])).Scan(&ok); err != nil {
		return nil, fmt.Errorf("inbox: lock a source's row: %w", err)
	}
	if !ok {
		return nil, nil
	}
	p := &sourceChange{source: o[0], row: o[1]}
	if err := readSources(ctx, tx, []*sourceChange{p}); err != nil {
		return nil, err
	}
	if p.err == nil && p.key != "" {
		ok, err := docstore.TryLockKey(ctx, tx, p.key)
		if err != nil || !ok {
			return nil, err
		}
	}
	return p, nil
}

func readOwners(ctx context.Context, tx pgx.Tx, keys []string) (map[string][2]string, error) {
	owners := map[string][2]string{}
	rows, err := tx.Query(ctx, `SELECT key, source, row_id FROM converge_mapped_rows WHERE key = ANY($1)`, keys)
	if err != nil {
		return nil, fmt.Errorf("inbox: read the keys' rows: %w", err)
	}
	var k, s, r string
	if _, err := pgx.ForEachRow(rows, []any{&k, &s, &r}, func() error { owners[k] = [2]string{s, r}; return nil }); err != nil {
		return nil, fmt.Errorf("inbox: read the keys' rows: %w", err)
	}
	return owners, nil
}

func readDocs(ctx context.Context, tx pgx.Tx, keys []string) (map[string]docState, error) {
	docs := map[string]docState{}
	rows, err := tx.Query(ctx, `SELECT key, version, deleted, content_hash FROM documents WHERE key = ANY($1)`, keys)
	if err != nil {
		return nil, fmt.Errorf("inbox: read the keys' documents: %w", err)
	}
	var k string
	var d docState
	if _, err := pgx.ForEachRow(rows, []any{&k, &d.version, &d.deleted, &d.hash}, func() error { docs[k] = d; return nil }); err != nil {
		return nil, fmt.Errorf("inbox: read the keys' documents: %w", err)
	}
	return docs, nil
}

// readSource reads the rows of source name that cs changed, through its
// view, and the keys they gave before. A row the view cannot give (a value
// its expressions refuse, an identity that is not one) is refused alone.
func readSource(ctx context.Context, tx pgx.Tx, name string, cs []*sourceChange) error {
	var views []string
	var typ string
	rows, err := tx.Query(ctx, `SELECT c.oid::regclass::text, format_type(a.atttypid, a.atttypmod)
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'row_id' AND NOT a.attisdropped
		WHERE c.relname = $1 AND c.relkind = 'v' AND has_table_privilege(c.oid, 'SELECT')`, source.ViewPrefix+name)
	if err != nil {
		return fmt.Errorf("inbox: find source %s's view: %w", name, err)
	}
	var v string
	if _, err := pgx.ForEachRow(rows, []any{&v, &typ}, func() error { views = append(views, v); return nil }); err != nil {
		return fmt.Errorf("inbox: find source %s's view: %w", name, err)
	}
	if len(views) != 1 {
		msg := fmt.Sprintf("no view %s%s the writer may read: install the source with converge source apply", source.ViewPrefix, name)
		if len(views) > 1 {
			msg = fmt.Sprintf("the writer may read %d views named %s%s (%v): keep one", len(views), source.ViewPrefix, name, views)
		}
		for _, c := range cs {
			c.err = &contract.ValidationError{Code: CodeUnknownSource, Field: "source", Message: msg}
		}
		return nil
	}
	query := fmt.Sprintf(`SELECT row_id::text, coalesce(key, ''), coalesce(title, ''), coalesce(body, ''),
		coalesce(array_remove(tags, NULL), '{}'), coalesce(array_remove(links, NULL), '{}'), coalesce(meta::text, '{}')
		FROM %s WHERE row_id = ANY($1::text[]::%s[])`, views[0], typ)
	if err := readIsolating(ctx, tx, name, views[0], query, cs); err != nil {
		var ue *UnreadableSourceError
		if !errors.As(err, &ue) {
			return err
		}
		// No row of it can be read now: they wait for its next attempt,
		// and the batch's others go on.
		for _, c := range cs {
			c.now, c.err, c.deferred, c.blocked = nil, nil, true, ue
		}
		return nil
	}
	ids, byRow := rowsOf(cs)
	rows, err = tx.Query(ctx, `SELECT row_id, key FROM converge_mapped_rows WHERE source = $1 AND row_id = ANY($2)`, name, ids)
	if err != nil {
		return fmt.Errorf("inbox: read source %s's keys: %w", name, err)
	}
	var id, key string
	if _, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error {
		if c := byRow[id]; c != nil {
			c.before = key
		}
		return nil
	}); err != nil {
		return fmt.Errorf("inbox: read source %s's keys: %w", name, err)
	}
	return nil
}

// readIsolating reads the view's rows of cs with query; where a row
// spoils the read, the halves are read apart, down to the rows that
// cannot be read, each refused alone (a batch of n rows with one such row
// takes some 2 log2 n reads, not n).
func readIsolating(ctx context.Context, tx pgx.Tx, name, view, query string, cs []*sourceChange) error {
	err := readRows(ctx, tx, name, query, cs)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || transient(pgErr) {
		return err
	}
	if !ofARow(pgErr) {
		return &UnreadableSourceError{Source: name, View: view, Err: pgErr}
	}
	if len(cs) == 1 {
		c := cs[0]
		c.now, c.err = nil, &contract.ValidationError{Code: CodeRowUnreadable, Field: "source",
			Message: fmt.Sprintf("row %s of source %s cannot be read through its view: %s (%s)", c.row, name, pgErr.Message, pgErr.Code)}
		return nil
	}
	half := len(cs) / 2
	if err := readIsolating(ctx, tx, name, view, query, cs[:half]); err != nil {
		return err
	}
	return readIsolating(ctx, tx, name, view, query, cs[half:])
}

// transient reports an error of the server's state rather than of a
// row's values (a connection, a deadlock or serialisation failure, a
// lock or statement timeout, resources, a shutdown): the batch is tried
// again rather than the row refused.
func transient(e *pgconn.PgError) bool {
	switch e.Code[:2] {
	case "08", "40", "53", "55", "57", "58", "XX":
		return true
	}
	return false
}

// rowsOf are the row identities of cs, and each one's change.
func rowsOf(cs []*sourceChange) ([]string, map[string]*sourceChange) {
	ids := make([]string, len(cs))
	byRow := make(map[string]*sourceChange, len(cs))
	for i, c := range cs {
		ids[i], byRow[c.row] = c.row, c
	}
	return ids, byRow
}

// readRows reads the view's rows of cs with query, in a savepoint of tx:
// a failure rolls it back alone, and is returned.
func readRows(ctx context.Context, tx pgx.Tx, name, query string, cs []*sourceChange) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: savepoint: %w", err)
	}
	ids, byRow := rowsOf(cs)
	got := map[*sourceChange]*viewRow{}
	rows, err := sp.Query(ctx, query, ids)
	if err == nil {
		var id string
		var vr viewRow
		_, err = pgx.ForEachRow(rows, []any{&id, &vr.key, &vr.title, &vr.body, &vr.tags, &vr.links, &vr.meta}, func() error {
			c := byRow[id]
			if c == nil {
				return nil
			}
			if got[c] != nil {
				c.err = &contract.ValidationError{Code: CodeRowTwice, Field: "source",
					Message: fmt.Sprintf("source %s's view gives row %s more than once: its mapping must give one document per row", name, id)}
				return nil
			}
			row := vr
			got[c] = &row
			return nil
		})
	}
	if err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: release savepoint: %w", err)
	}
	for _, c := range cs {
		if c.err == nil {
			c.now = got[c]
		}
	}
	return nil
}

// decide sets c's writes from what its row gives now (c.doc, c.key; no
// key: nothing) and the key it gave before; takenBy names the change of
// the batch that gives each key.
func decide(c *sourceChange, takenBy map[string]*sourceChange, docs map[string]docState) {
	withdraw := func(key string) {
		if d, ok := docs[key]; ok && !d.deleted {
			c.writes = append(c.writes, docstore.Write{Doc: contract.Document{Key: key, Version: d.version + 1}, Withdraw: true})
		}
	}
	if c.before != "" && c.before != c.key && takenBy[c.before] == nil {
		withdraw(c.before)
	}
	if c.key != "" {
		d, ok := docs[c.key]
		if !ok || d.deleted || d.hash != contract.ContentHash(c.doc) {
			doc := c.doc
			doc.Version = 1
			if ok {
				doc.Version = d.version + 1
			}
			c.writes = append(c.writes, docstore.Write{Doc: doc})
		}
	}
	c.result = docstore.Applied
	if len(c.writes) == 0 {
		c.result = docstore.Unchanged
	}
}

// finishSources records, in tx, the key each applied change's row gives.
func finishSources(ctx context.Context, tx pgx.Tx, applied []*sourceChange) error {
	var gone, goneRows, srcs, rowIDs, keys []string
	for _, c := range applied {
		if c.key == "" {
			gone, goneRows = append(gone, c.source), append(goneRows, c.row)
			continue
		}
		srcs, rowIDs, keys = append(srcs, c.source), append(rowIDs, c.row), append(keys, c.key)
	}
	if len(gone) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM converge_mapped_rows s USING unnest($1::text[], $2::text[]) AS g(source, row_id)
			WHERE s.source = g.source AND s.row_id = g.row_id`, gone, goneRows); err != nil {
			return fmt.Errorf("inbox: forget the sources' gone rows: %w", err)
		}
	}
	if len(keys) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO converge_mapped_rows (source, row_id, key) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
			ON CONFLICT (source, row_id) DO UPDATE SET key = EXCLUDED.key WHERE converge_mapped_rows.key <> EXCLUDED.key`, srcs, rowIDs, keys); err != nil {
			return fmt.Errorf("inbox: record the sources' keys: %w", err)
		}
	}
	return nil
}
