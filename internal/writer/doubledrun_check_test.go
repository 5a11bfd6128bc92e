package writer_test

// The doubled-run's checks: answers against what each op should get, and
// the database and GET against the corpus.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

type drEvKey struct {
	Key     string
	Version int64
	Kind    string
}

// drLimiter reports the first few of many similar errors.
type drLimiter struct {
	t     *testing.T
	label string
	n     int
}

func (l *drLimiter) errorf(format string, args ...any) {
	l.t.Helper()
	if l.n++; l.n <= 15 {
		l.t.Errorf(l.label+": "+format, args...)
	}
}

func (l *drLimiter) done() {
	l.t.Helper()
	if l.n > 15 {
		l.t.Errorf("%s: ... %d errors in all", l.label, l.n)
	}
}

func drFatalErrs(t *testing.T, label string, errs []error) {
	t.Helper()
	if len(errs) == 0 {
		return
	}
	for i, err := range errs {
		if i == 15 {
			break
		}
		t.Errorf("%s: %v", label, err)
	}
	t.Fatalf("%s: %d requests failed", label, len(errs))
}

// drCheckResults compares every answer with expect(op) and the event id with
// the contract's, and returns the results by kind.
func drCheckResults(t *testing.T, label string, recs []drRecord, expect func(*corpus.Op) string) map[string]int {
	t.Helper()
	lim := &drLimiter{t: t, label: label}
	counts := map[string]int{}
	for _, r := range recs {
		counts[r.via]++
		if r.res.Error != nil {
			counts["error"]++
			lim.errorf("%s via %s: error %s: %s", r.op, r.via, r.res.Error.Code, r.res.Error.Message)
			continue
		}
		counts[r.res.Result]++
		if want := expect(r.op); want != "" && r.res.Result != want {
			lim.errorf("%s via %s: result %q, want %q", r.op, r.via, r.res.Result, want)
		}
		if want := contract.EventID(r.op.Key, r.op.Version, r.op.Kind()); r.res.EventID == nil || *r.res.EventID != want {
			lim.errorf("%s via %s: event_id %v, want %s", r.op, r.via, r.res.EventID, want)
		}
	}
	lim.done()
	return counts
}

// drCheckOutboxExact compares the outbox's (key, version, kind) with want:
// the same set, and no (key, version, kind) twice.
func drCheckOutboxExact(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, want map[drEvKey]bool) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT key, version, kind FROM outbox`)
	if err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	defer rows.Close()
	got := map[drEvKey]int{}
	var e drEvKey
	for rows.Next() {
		if err := rows.Scan(&e.Key, &e.Version, &e.Kind); err != nil {
			t.Fatalf("%s: outbox: %v", label, err)
		}
		got[e]++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	lim := &drLimiter{t: t, label: label + ": outbox"}
	for e, n := range got {
		switch {
		case !want[e]:
			lim.errorf("unexpected event %q@%d %s (%d rows)", e.Key, e.Version, e.Kind, n)
		case n != 1:
			lim.errorf("event %q@%d %s is there %d times, want once", e.Key, e.Version, e.Kind, n)
		}
	}
	for e := range want {
		if got[e] == 0 {
			lim.errorf("missing event %q@%d %s", e.Key, e.Version, e.Kind)
		}
	}
	lim.done()
}

// drCheckOutboxEvents decodes every outbox payload: it must be a valid event
// whose id, key, version and kind are the row's, describing the corpus'
// drOp of that version.
func drCheckOutboxEvents(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, c *corpus.Corpus) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT event_id::text, key, version, kind, payload::text FROM outbox`)
	if err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	defer rows.Close()
	lim := &drLimiter{t: t, label: label + ": outbox payload"}
	var (
		id, key, kind, payload string
		version                int64
	)
	for rows.Next() {
		if err := rows.Scan(&id, &key, &version, &kind, &payload); err != nil {
			t.Fatalf("%s: outbox: %v", label, err)
		}
		ev, err := contract.DecodeEvent([]byte(payload))
		if err != nil {
			lim.errorf("event %s (%q@%d): %v", id, key, version, err)
			continue
		}
		if ev.ID.String() != id || ev.Key != key || ev.Version != version || string(ev.Kind) != kind {
			lim.errorf("row (%s, %q, %d, %s) carries event (%s, %q, %d, %s)", id, key, version, kind, ev.ID, ev.Key, ev.Version, ev.Kind)
			continue
		}
		o := c.Lookup(key, version, contract.Kind(kind))
		if o == nil {
			lim.errorf("event %q@%d %s is of no op of the corpus", key, version, kind)
			continue
		}
		if !o.Withdraw && (ev.Title != o.Title || ev.Body() != o.Body || !slices.Equal(ev.Links, drSortedSet(o.Links)) ||
			!slices.Equal(ev.Tags, drSortedSet(o.Tags)) || !drMetaEqual(ev.Meta, o.Meta)) {
			lim.errorf("event of %s does not carry its content", o)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	lim.done()
}

// drCheckAgainstCorpus compares the documents and chunks with the final op
// of every key of the corpus.
func drCheckAgainstCorpus(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, c *corpus.Corpus) {
	t.Helper()
	lim := &drLimiter{t: t, label: label + ": contents"}
	rows, err := pool.Query(ctx, `
SELECT d.key, d.version, d.deleted, d.title, d.links, d.tags, d.meta::text, d.content_hash, d.chunk_count,
       (SELECT count(*) FROM chunks c WHERE c.key = d.key),
       coalesce((SELECT string_agg(c.text, '' ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '')
FROM documents d`)
	if err != nil {
		t.Fatalf("%s: documents: %v", label, err)
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		var (
			key, title, meta, hash, body string
			version                      int64
			deleted                      bool
			links, tags                  []string
			chunkCount                   int
			chunkRows                    int64
		)
		if err := rows.Scan(&key, &version, &deleted, &title, &links, &tags, &meta, &hash, &chunkCount, &chunkRows, &body); err != nil {
			t.Fatalf("%s: documents: %v", label, err)
		}
		found[key] = true
		o := c.Final[key]
		if o == nil {
			lim.errorf("document %q is not in the corpus", key)
			continue
		}
		if version != o.Version || deleted != o.Withdraw {
			lim.errorf("%q stored at version %d (deleted %v), want the final %s", key, version, deleted, o)
			continue
		}
		if int64(chunkCount) != chunkRows {
			lim.errorf("%q: chunk_count %d but %d chunk rows", key, chunkCount, chunkRows)
		}
		if o.Withdraw {
			if title != "" || len(links) > 0 || len(tags) > 0 || meta != "{}" || body != "" || hash != contract.WithdrawnHash(key) {
				lim.errorf("%q: tombstone has content: title %q links %v tags %v meta %s body %d bytes hash %s",
					key, title, links, tags, meta, len(body), hash)
			}
			continue
		}
		norm, err := o.Document.Normalize()
		if err != nil {
			t.Fatalf("corpus %s is invalid: %v", o, err)
		}
		switch {
		case title != o.Title:
			lim.errorf("%q: title %q, want %q", key, title, o.Title)
		case body != o.Body:
			lim.errorf("%q: body of %d bytes differs from the %d bytes written", key, len(body), len(o.Body))
		case !slices.Equal(links, norm.Links) || !slices.Equal(tags, norm.Tags):
			lim.errorf("%q: links %q tags %q, want %q %q", key, links, tags, norm.Links, norm.Tags)
		case !drMetaEqual(json.RawMessage(meta), o.Meta):
			lim.errorf("%q: meta %s, want %s", key, meta, o.Meta)
		case hash != contract.ContentHash(norm):
			lim.errorf("%q: content_hash %s, want %s", key, hash, contract.ContentHash(norm))
		case chunkCount != len(chunking.Split(o.Body, chunking.DefaultConfig())):
			lim.errorf("%q: %d chunks, want %d", key, chunkCount, len(chunking.Split(o.Body, chunking.DefaultConfig())))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: documents: %v", label, err)
	}
	for _, k := range c.Keys {
		if !found[k] {
			lim.errorf("document %q is missing", k)
		}
	}

	// Every chunk belongs to its document's current version, under its
	// derived id, with ordinals 0..n-1.
	crows, err := pool.Query(ctx, `SELECT c.id::text, c.key, c.version, c.ordinal, c.content_hash, c.text, d.version, d.deleted
FROM chunks c JOIN documents d USING (key) ORDER BY c.key, c.ordinal`)
	if err != nil {
		t.Fatalf("%s: chunks: %v", label, err)
	}
	defer crows.Close()
	next := map[string]int{}
	for crows.Next() {
		var (
			id, key, hash, text string
			version, docVersion int64
			ordinal             int
			deleted             bool
		)
		if err := crows.Scan(&id, &key, &version, &ordinal, &hash, &text, &docVersion, &deleted); err != nil {
			t.Fatalf("%s: chunks: %v", label, err)
		}
		switch {
		case version != docVersion || deleted:
			lim.errorf("chunk %s of %q is of version %d, the document is at %d (deleted %v)", id, key, version, docVersion, deleted)
		case ordinal != next[key]:
			lim.errorf("chunk %s of %q has ordinal %d, want %d", id, key, ordinal, next[key])
		case id != contract.ChunkID(key, version, ordinal).String():
			lim.errorf("chunk %q@%d#%d has id %s, want %s", key, version, ordinal, id, contract.ChunkID(key, version, ordinal))
		case hash != contract.TextHash(text):
			lim.errorf("chunk %s of %q: content_hash does not match its text", id, key)
		}
		next[key] = ordinal + 1
	}
	if err := crows.Err(); err != nil {
		t.Fatalf("%s: chunks: %v", label, err)
	}
	lim.done()
}

// drCheckGet reads keys back through GET /v1/documents/{key}.
func drCheckGet(t *testing.T, ctx context.Context, l *drLoader, c *corpus.Corpus, keys []string) {
	t.Helper()
	lim := &drLimiter{t: t, label: "GET round trip"}
	get := func(key string) (int, []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, drDocURL(l.base, key), nil)
		if err != nil {
			t.Fatal(err)
		}
		status, data, err := l.do(req)
		if err != nil {
			t.Fatalf("GET %q: %v", key, err)
		}
		return status, data
	}
	for _, key := range keys {
		status, data := get(key)
		if status != http.StatusOK {
			lim.errorf("GET %q: status %d: %.300s", key, status, data)
			continue
		}
		var rec docstore.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			lim.errorf("GET %q: %v", key, err)
			continue
		}
		o := c.Final[key]
		switch {
		case rec.Key != key:
			lim.errorf("GET %q answered key %q", key, rec.Key)
		case rec.Version != o.Version || rec.Withdrawn != o.Withdraw:
			lim.errorf("GET %q: version %d withdrawn %v, want %s", key, rec.Version, rec.Withdrawn, o)
		case !o.Withdraw && (rec.Title != o.Title || rec.Body != o.Body || !slices.Equal(rec.Links, drSortedSet(o.Links)) ||
			!slices.Equal(rec.Tags, drSortedSet(o.Tags)) || !drMetaEqual(rec.Meta, o.Meta)):
			lim.errorf("GET %q: content differs from %s", key, o)
		case o.Withdraw && (rec.Body != "" || rec.Chunks != 0):
			lim.errorf("GET %q: tombstone with a body", key)
		}
	}
	// A key that was never written, next to ones that were.
	for _, key := range []string{"a/b/", "a%2Fb ", "never written ?%/x"} {
		if status, data := get(key); status != http.StatusNotFound {
			lim.errorf("GET %q (never written): status %d, want 404: %.200s", key, status, data)
		}
	}
	lim.done()
}

func drSortedSet(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func drMetaEqual(a, b json.RawMessage) bool {
	dec := func(m json.RawMessage) (any, bool) {
		if len(bytes.TrimSpace(m)) == 0 {
			m = json.RawMessage(`{}`)
		}
		var v any
		return v, json.Unmarshal(m, &v) == nil
	}
	va, oka := dec(a)
	vb, okb := dec(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}
