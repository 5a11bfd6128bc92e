package docstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

// outboxRow is one row of the outbox.
type outboxRow struct {
	key      string
	version  int64
	kind     string
	payload  string
	emission int64
}

func outboxRows(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID]outboxRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, key, version, kind, payload::text, emission FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]outboxRow{}
	var (
		id uuid.UUID
		r  outboxRow
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.key, &r.version, &r.kind, &r.payload, &r.emission}, func() error {
		out[id] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A re-emission writes, for each document's current version, an outbox row
// with the original event byte for byte under the same event id, and a
// fresh emission number; keys without a document are reported.
func TestReemitRebuildsTheOriginalEvent(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	long := doc("notes/long é.md", 3, strings.Repeat("A paragraph of text that goes on.\n\n", 200))
	long.Meta = json.RawMessage(`{"z":[1,2.50,{"b":null,"a":"\u00e9\u2028"}],"a":{"y":true},"big":123456789012345678901234567890}`)
	long.Links = []string{"b", "a", "b"}
	for _, d := range []contract.Document{long, doc("plain", 1, "a short body"), doc("plain", 2, "a newer body"), doc("gone", 4, "soon withdrawn")} {
		if _, err := s.Put(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Withdraw(ctx, "gone", 5); err != nil {
		t.Fatal(err)
	}
	before := outboxRows(t, pool)
	for _, r := range before {
		if r.emission != 0 {
			t.Fatalf("an original emission has emission %d, want 0", r.emission)
		}
	}

	got, err := s.Reemit(ctx, []string{"plain", "missing", long.Key, "gone", "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.NotFound, []string{"missing"}) {
		t.Fatalf("not found %v, want [missing]", got.NotFound)
	}
	want := []struct {
		key     string
		version int64
		kind    contract.Kind
	}{{"gone", 5, contract.KindWithdrawn}, {long.Key, 3, contract.KindUpserted}, {"plain", 2, contract.KindUpserted}}
	if len(got.Reemitted) != len(want) {
		t.Fatalf("re-emitted %+v, want %d documents", got.Reemitted, len(want))
	}
	after := outboxRows(t, pool)
	if len(after) != len(before) {
		t.Fatalf("%d outbox rows after the re-emission, %d before: want the same events", len(after), len(before))
	}
	emissions := map[int64]bool{}
	for i, w := range want {
		r := got.Reemitted[i]
		id := contract.EventID(w.key, w.version, w.kind)
		if r.Key != w.key || r.Version != w.version || r.EventID != id || r.Emission <= 0 || emissions[r.Emission] {
			t.Fatalf("re-emission %d = %+v, want %s v%d event %s with a fresh emission", i, r, w.key, w.version, id)
		}
		emissions[r.Emission] = true
		row, orig := after[id], before[id]
		if row.emission != r.Emission || row.key != w.key || row.version != w.version || row.kind != string(w.kind) {
			t.Fatalf("outbox row of %s = %+v, want emission %d", w.key, row, r.Emission)
		}
		if row.payload != orig.payload {
			t.Fatalf("%s: re-emitted payload differs from the original:\n%s\n%s", w.key, row.payload, orig.payload)
		}
	}
	// The superseded version's row is left as it was.
	if r := after[contract.EventID("plain", 1, contract.KindUpserted)]; r.emission != 0 {
		t.Fatalf("the row of plain v1 was re-emitted: %+v", r)
	}

	again, err := s.Reemit(ctx, []string{"plain"})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Reemitted) != 1 || again.Reemitted[0].Emission <= got.Reemitted[2].Emission {
		t.Fatalf("a second re-emission %+v, want an emission above %d", again.Reemitted, got.Reemitted[2].Emission)
	}
	var ve *contract.ValidationError
	if _, err := s.Reemit(ctx, []string{"ok", ""}); !errors.As(err, &ve) {
		t.Fatalf("an empty key: %v, want a validation error", err)
	}
	if out, err := s.Reemit(ctx, nil); err != nil || len(out.Reemitted)+len(out.NotFound) != 0 {
		t.Fatalf("no keys: %+v %v", out, err)
	}
}

// jsonb keeps a meta number's value, not its spelling: such a document is
// re-emitted from its original outbox row while it is there, then from its
// stored meta text; a row without meta text (written before schema version
// 3) is refused, naming it, once retention removed its original. Stored chunks that are not those
// of the version are refused too; a refused call writes nothing.
func TestReemitRefusesWhatItCannotReproduce(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	odd := doc("odd", 1, "body")
	odd.Meta = json.RawMessage(`{"n":1e2}`)
	for _, d := range []contract.Document{odd, doc("fine", 1, "body"), doc("cut", 1, strings.Repeat("Some text here.\n\n", 300))} {
		if _, err := s.Put(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	before := outboxRows(t, pool)
	oddID := contract.EventID("odd", 1, contract.KindUpserted)

	got, err := s.Reemit(ctx, []string{"odd", "fine"})
	if err != nil {
		t.Fatalf("with the original in the outbox: %v", err)
	}
	if len(got.Reemitted) != 2 || outboxRows(t, pool)[oddID].payload != before[oddID].payload {
		t.Fatalf("odd was not re-emitted from its original: %+v", got)
	}

	// Without the original (retention), the event is rebuilt from the
	// meta text stored beside the jsonb: the same bytes, the same hash.
	if _, err := pool.Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Reemit(ctx, []string{"odd"}); err != nil || len(got.Reemitted) != 1 {
		t.Fatalf("odd without its original: %+v %v; want it rebuilt from meta_text", got, err)
	}
	if payload := outboxRows(t, pool)[oddID].payload; payload != before[oddID].payload {
		t.Fatalf("odd rebuilt from meta_text as\n%s\nwant the original\n%s", payload, before[oddID].payload)
	}

	// A row written before schema version 3 has no meta text: without its
	// original it cannot be reproduced.
	if _, err := pool.Exec(ctx, `DELETE FROM outbox; UPDATE documents SET meta_text = NULL WHERE key = 'odd'`); err != nil {
		t.Fatal(err)
	}
	_, err = s.Reemit(ctx, []string{"fine", "odd"})
	var nr *docstore.NotReproducibleError
	if !errors.Is(err, docstore.ErrNotReproducible) || !errors.As(err, &nr) || nr.Key != "odd" || nr.Version != 1 {
		t.Fatalf("odd without its original or meta text: %v, want a NotReproducibleError naming it", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("a refused re-emission wrote %d outbox rows", n)
	}

	if _, err := pool.Exec(ctx, `DELETE FROM chunks WHERE key = 'cut' AND ordinal = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = s.Reemit(ctx, []string{"cut"})
	if !errors.As(err, &nr) || nr.Key != "cut" {
		t.Fatalf("a document missing a chunk: %v, want a NotReproducibleError naming it", err)
	}
	if _, err := s.Reemit(ctx, []string{"fine"}); err != nil {
		t.Fatalf("the others still re-emit: %v", err)
	}
}

// ReemitAll pages through every document in key order.
func TestReemitAllPages(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	var writes []docstore.Write
	var keys []string
	for i := range 23 {
		key := fmt.Sprintf("k%02d", i)
		keys = append(keys, key)
		writes = append(writes, docstore.Write{Doc: doc(key, 1, "body "+key)})
	}
	if _, err := s.Apply(ctx, writes); err != nil {
		t.Fatal(err)
	}
	var seen []string
	after, pages := "", 0
	for {
		got, next, err := s.ReemitAll(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range got.Reemitted {
			seen = append(seen, r.Key)
		}
		if len(got.NotFound) != 0 {
			t.Fatalf("not found %v while paging", got.NotFound)
		}
		if next == "" {
			break
		}
		if next != got.Reemitted[len(got.Reemitted)-1].Key {
			t.Fatalf("next %q is not the page's last key", next)
		}
		after = next
	}
	if !slices.Equal(seen, keys) || pages != 3 {
		t.Fatalf("paged %d times through %v, want 3 pages of %v", pages, seen, keys)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE emission > 0`); n != len(keys) {
		t.Fatalf("%d re-emitted outbox rows, want %d", n, len(keys))
	}
	// A page that ends exactly at the last document says so.
	got, next, err := s.ReemitAll(ctx, "k12", 10)
	if err != nil || len(got.Reemitted) != 10 || next != "" {
		t.Fatalf("the last full page: %d documents, next %q, %v", len(got.Reemitted), next, err)
	}
	if _, _, err := s.ReemitAll(ctx, "", 0); err == nil {
		t.Fatal("a limit of 0 was accepted")
	}
}

// A re-emission takes the key locks the writes take: it waits for a
// transaction holding one, so it can never interleave with a write of the
// same key.
func TestReemitTakesTheWritersKeyLocks(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	if _, err := s.Put(ctx, doc("locked", 1, "body")); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, docstore.LockSQL, []string{"locked"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Reemit(ctx, []string{"locked"})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the re-emission finished while the key was locked: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
