package writer

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

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
)

// sourceLockClass is the advisory lock class of the sources' rows
// ("SOUR").
const sourceLockClass int32 = 0x534F5552

// sourceChange is one changed row of a source, as handed over (perhaps
// several times: at indexes at of the batch).
type sourceChange struct {
	source, row string
	at          []int

	err    error            // a refusal
	writes []docstore.Write // what applying it writes (none: unchanged)
	key    string           // the key its row gives now; "" for none
	result docstore.Result
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

// prepareSources reads, in tx, the document each changed row gives now
// and decides its writes: an upsert at the next version of its key when
// its content changed, a withdrawal of the key it gave before when the row
// is gone from the view or its key changed. The rows are locked first
// (transaction advisory locks, in one order), so that two writers taking
// changes of one row apply them one after the other, each reading what
// committed before it: versions follow the commits.
func prepareSources(ctx context.Context, tx pgx.Tx, changes []*sourceChange) error {
	locks := make([]int32, 0, len(changes))
	for _, c := range changes {
		h := fnv.New32a()
		_, _ = h.Write([]byte(c.source + "\x00" + c.row)) // a hash.Hash never fails
		locks = append(locks, int32(h.Sum32()))           //nolint:gosec // a lock's number: any 32 bits
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	// The class keeps them apart from the documents' key locks (docstore's
	// 0x434F4E56) and from other applications' advisory locks.
	if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock($1, l)) FROM unnest($2::int4[]) AS l`, sourceLockClass, locks); err != nil {
		return fmt.Errorf("inbox: lock the sources' rows: %w", err)
	}
	bySource := map[string][]*sourceChange{}
	var names []string
	for _, c := range changes {
		if _, ok := bySource[c.source]; !ok {
			names = append(names, c.source)
		}
		bySource[c.source] = append(bySource[c.source], c)
	}
	slices.Sort(names)
	rowsNow := map[*sourceChange]*viewRow{}
	before := map[*sourceChange]string{}
	for _, name := range names {
		cs := bySource[name]
		if err := readSource(ctx, tx, name, cs, rowsNow, before); err != nil {
			return err
		}
	}
	// The keys' owners and their documents, as stored.
	var keys []string
	for _, c := range changes {
		if r := rowsNow[c]; r != nil {
			keys = append(keys, r.key)
		}
		if k := before[c]; k != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	owners := map[string][2]string{}
	rows, err := tx.Query(ctx, `SELECT key, source, row_id FROM converge_source_rows WHERE key = ANY($1)`, keys)
	if err != nil {
		return fmt.Errorf("inbox: read the keys' rows: %w", err)
	}
	var k, s, r string
	if _, err := pgx.ForEachRow(rows, []any{&k, &s, &r}, func() error { owners[k] = [2]string{s, r}; return nil }); err != nil {
		return fmt.Errorf("inbox: read the keys' rows: %w", err)
	}
	docs := map[string]docState{}
	rows, err = tx.Query(ctx, `SELECT key, version, deleted, content_hash FROM documents WHERE key = ANY($1) ORDER BY key FOR UPDATE`, keys)
	if err != nil {
		return fmt.Errorf("inbox: read the keys' documents: %w", err)
	}
	var d docState
	if _, err := pgx.ForEachRow(rows, []any{&k, &d.version, &d.deleted, &d.hash}, func() error { docs[k] = d; return nil }); err != nil {
		return fmt.Errorf("inbox: read the keys' documents: %w", err)
	}
	for _, c := range changes {
		if c.err != nil {
			continue
		}
		decide(c, rowsNow[c], before[c], owners, docs)
		if c.err == nil && c.key != "" {
			// A later row of the batch giving the same key finds this one.
			if _, ok := owners[c.key]; !ok {
				owners[c.key] = [2]string{c.source, c.row}
			}
		}
	}
	return nil
}

// readSource reads the rows of source name that changes name, through
// its view, and the keys they gave before.
func readSource(ctx context.Context, tx pgx.Tx, name string, cs []*sourceChange, now map[*sourceChange]*viewRow, before map[*sourceChange]string) error {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.row
	}
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
	byRow := map[string]*sourceChange{}
	for _, c := range cs {
		byRow[c.row] = c
	}
	rows, err = tx.Query(ctx, fmt.Sprintf(`SELECT row_id::text, coalesce(key, ''), coalesce(title, ''), coalesce(body, ''),
		coalesce(tags, '{}'), coalesce(links, '{}'), coalesce(meta::text, '{}') FROM %s WHERE row_id = ANY($1::text[]::%s[])`, views[0], typ), ids)
	if err != nil {
		return fmt.Errorf("inbox: read source %s's rows: %w", name, err)
	}
	var id string
	var vr viewRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &vr.key, &vr.title, &vr.body, &vr.tags, &vr.links, &vr.meta}, func() error {
		c := byRow[id]
		if c == nil {
			return nil
		}
		if now[c] != nil {
			c.err = &contract.ValidationError{Code: CodeRowTwice, Field: "source",
				Message: fmt.Sprintf("source %s's view gives row %s more than once: its mapping must give one document per row", name, id)}
			return nil
		}
		row := vr
		now[c] = &row
		return nil
	}); err != nil {
		return fmt.Errorf("inbox: read source %s's rows: %w", name, err)
	}
	rows, err = tx.Query(ctx, `SELECT row_id, key FROM converge_source_rows WHERE source = $1 AND row_id = ANY($2)`, name, ids)
	if err != nil {
		return fmt.Errorf("inbox: read source %s's keys: %w", name, err)
	}
	var key string
	if _, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error {
		if c := byRow[id]; c != nil {
			before[c] = key
		}
		return nil
	}); err != nil {
		return fmt.Errorf("inbox: read source %s's keys: %w", name, err)
	}
	return nil
}

// decide sets c's writes: now is what its row gives (nil: nothing),
// before the key it gave.
func decide(c *sourceChange, now *viewRow, before string, owners map[string][2]string, docs map[string]docState) {
	withdraw := func(key string) {
		if d, ok := docs[key]; ok && !d.deleted {
			c.writes = append(c.writes, docstore.Write{Doc: contract.Document{Key: key, Version: d.version + 1}, Withdraw: true})
		}
	}
	if now == nil {
		if before != "" {
			withdraw(before)
		}
		c.result = docstore.Applied
		if len(c.writes) == 0 {
			c.result = docstore.Unchanged
		}
		return
	}
	if o, ok := owners[now.key]; ok && (o[0] != c.source || o[1] != c.row) {
		c.err = &contract.ValidationError{Code: CodeDuplicateKey, Field: "key",
			Message: fmt.Sprintf("row %s of source %s gives key %q, which row %s of source %s gives already", c.row, c.source, now.key, o[1], o[0])}
		return
	}
	doc := contract.Document{Key: now.key, Version: 1, Title: now.title, Body: now.body, Tags: now.tags, Links: now.links, Meta: json.RawMessage(now.meta)}
	norm, err := doc.Normalize()
	if err != nil {
		c.err = err
		return
	}
	c.key = now.key
	if before != "" && before != now.key {
		withdraw(before)
	}
	d, ok := docs[now.key]
	if ok && !d.deleted && d.hash == contract.ContentHash(norm) {
		c.result = docstore.Unchanged
		if len(c.writes) > 0 {
			c.result = docstore.Applied
		}
		return
	}
	if ok {
		doc.Version = d.version + 1
	}
	c.writes = append(c.writes, docstore.Write{Doc: doc})
	c.result = docstore.Applied
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
		if _, err := tx.Exec(ctx, `DELETE FROM converge_source_rows s USING unnest($1::text[], $2::text[]) AS g(source, row_id)
			WHERE s.source = g.source AND s.row_id = g.row_id`, gone, goneRows); err != nil {
			return fmt.Errorf("inbox: forget the sources' gone rows: %w", err)
		}
	}
	if len(keys) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO converge_source_rows (source, row_id, key) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
			ON CONFLICT (source, row_id) DO UPDATE SET key = EXCLUDED.key WHERE converge_source_rows.key <> EXCLUDED.key`, srcs, rowIDs, keys); err != nil {
			return fmt.Errorf("inbox: record the sources' keys: %w", err)
		}
	}
	return nil
}
