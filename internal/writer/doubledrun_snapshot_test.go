package writer_test

// Snapshots of the writer's tables, compared across loads: counts,
// checksums and every row, with the timestamps apart.

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// drTables are checksummed over their rows in primary-key order, without the
// timestamps (updated_at, created_at), which are checked apart.
var drTables = []struct{ name, sel, pk string }{
	{"documents", "SELECT key, version, deleted, title, links, tags, meta, content_hash, chunk_count FROM documents", "key"},
	{"chunks", "SELECT id, key, version, ordinal, text, content_hash FROM chunks", "id"},
	{"outbox", "SELECT event_id, key, version, kind, payload FROM outbox", "event_id"},
}

type drTableState struct {
	Count int64
	Sum   string
	Rows  map[string]string // primary key -> row
}

type drDbState struct {
	Tables map[string]drTableState
	// Stamps is a checksum of the timestamps: a row rewritten with the same
	// content changes it.
	Stamps string
}

func drSnapshot(t *testing.T, ctx context.Context, pool *pgxpool.Pool) drDbState {
	t.Helper()
	st := drDbState{Tables: map[string]drTableState{}}
	for _, tb := range drTables {
		var ts drTableState
		q := fmt.Sprintf("SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t.%s)), '') FROM (%s) t", tb.pk, tb.sel)
		if err := pool.QueryRow(ctx, q).Scan(&ts.Count, &ts.Sum); err != nil {
			t.Fatalf("checksum %s: %v", tb.name, err)
		}
		rows, err := pool.Query(ctx, fmt.Sprintf("SELECT t.%s::text, t::text FROM (%s) t", tb.pk, tb.sel))
		if err != nil {
			t.Fatalf("rows of %s: %v", tb.name, err)
		}
		defer rows.Close() // on t.Fatal; it is closed at the end of the loop anyway
		ts.Rows = map[string]string{}
		var pk, row string
		for rows.Next() {
			if err := rows.Scan(&pk, &row); err != nil {
				t.Fatalf("rows of %s: %v", tb.name, err)
			}
			ts.Rows[pk] = row
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("rows of %s: %v", tb.name, err)
		}
		if int64(len(ts.Rows)) != ts.Count {
			t.Fatalf("%s: count(*) %d but %d distinct primary keys read", tb.name, ts.Count, len(ts.Rows))
		}
		st.Tables[tb.name] = ts
	}
	const stampsSQL = `SELECT
	    coalesce((SELECT md5(string_agg(key || ' ' || updated_at::text, '|' ORDER BY key)) FROM documents), '') || ':' ||
	    coalesce((SELECT md5(string_agg(event_id::text || ' ' || created_at::text, '|' ORDER BY event_id)) FROM outbox), '')`
	if err := pool.QueryRow(ctx, stampsSQL).Scan(&st.Stamps); err != nil {
		t.Fatalf("timestamps: %v", err)
	}
	return st
}

// drCompareStates reports every difference of got from want in the named
// drTables: count, checksum and rows.
func drCompareStates(t *testing.T, label string, want, got drDbState, names ...string) {
	t.Helper()
	for _, name := range names {
		w, g := want.Tables[name], got.Tables[name]
		if w.Count != g.Count {
			t.Errorf("%s: %s has %d rows, want %d", label, name, g.Count, w.Count)
		}
		if w.Sum != g.Sum {
			t.Errorf("%s: %s checksum %s, want %s", label, name, g.Sum, w.Sum)
		}
		lim := &drLimiter{t: t, label: label + ": " + name}
		for _, pk := range drSortedKeys(w.Rows) {
			switch gr, ok := g.Rows[pk]; {
			case !ok:
				lim.errorf("row %s is missing; was %.300s", pk, w.Rows[pk])
			case gr != w.Rows[pk]:
				lim.errorf("row %s changed:\n got  %.300s\n want %.300s", pk, gr, w.Rows[pk])
			}
		}
		for _, pk := range drSortedKeys(g.Rows) {
			if _, ok := w.Rows[pk]; !ok {
				lim.errorf("extra row %s: %.300s", pk, g.Rows[pk])
			}
		}
		lim.done()
	}
}

func drSortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func drTableCounts(st drDbState) string {
	return fmt.Sprintf("documents=%d chunks=%d outbox=%d",
		st.Tables["documents"].Count, st.Tables["chunks"].Count, st.Tables["outbox"].Count)
}
