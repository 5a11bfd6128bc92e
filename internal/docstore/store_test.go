package docstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

func newStore(t *testing.T) (*docstore.Store, *pgxpool.Pool) {
	t.Helper()
	url := pg.MigratedDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func doc(key string, version int64, body string) contract.Document {
	return contract.Document{Key: key, Version: version, Title: "T " + key, Body: body,
		Links: []string{"other"}, Tags: []string{"t"}, Meta: json.RawMessage(`{"v":1}`)}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPutResults(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	steps := []struct {
		name string
		doc  contract.Document
		want docstore.Result
		err  error
	}{
		{"first version", doc("a", 1, "one"), docstore.Applied, nil},
		{"redelivery", doc("a", 1, "one"), docstore.Unchanged, nil},
		{"same version, other content", doc("a", 1, "uno"), "", docstore.ErrVersionConflict},
		{"newer version", doc("a", 3, "three"), docstore.Applied, nil},
		{"older version late", doc("a", 2, "two"), docstore.Stale, nil},
		{"first version again", doc("a", 1, "one"), docstore.Stale, nil},
	}
	for _, st := range steps {
		out, err := s.Put(ctx, st.doc)
		if st.err != nil {
			var ce *docstore.ConflictError
			if !errors.Is(err, st.err) || !errors.As(err, &ce) || ce.Version != st.doc.Version {
				t.Fatalf("%s: err = %v, want %v", st.name, err, st.err)
			}
			continue
		}
		if err != nil || out.Result != st.want {
			t.Fatalf("%s: result %q err %v, want %q", st.name, out.Result, err, st.want)
		}
		if out.EventID != contract.EventID(st.doc.Key, st.doc.Version, contract.KindUpserted) {
			t.Fatalf("%s: event id %s is not the derived one", st.name, out.EventID)
		}
	}
	rec, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Version != 3 || rec.Body != "three" || rec.Withdrawn || rec.Chunks != 1 {
		t.Fatalf("stored record %+v", rec)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE key = 'a'`); n != 2 {
		t.Fatalf("outbox holds %d events for a, want 2 (versions 1 and 3)", n)
	}
	var chunkID string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM chunks WHERE key = 'a'`).Scan(&chunkID); err != nil {
		t.Fatal(err)
	}
	if chunkID != contract.ChunkID("a", 3, 0).String() {
		t.Fatalf("chunk id %s is not the derived id of (a, 3, 0)", chunkID)
	}
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, docstore.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
}

func TestWithdrawKeepsTombstone(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	mustResult := func(out docstore.Outcome, err error, want docstore.Result) {
		t.Helper()
		if err != nil || out.Result != want {
			t.Fatalf("result %q err %v, want %q", out.Result, err, want)
		}
	}
	out, err := s.Put(ctx, doc("w", 1, "body\n\nmore"))
	mustResult(out, err, docstore.Applied)
	out, err = s.Withdraw(ctx, "w", 2)
	mustResult(out, err, docstore.Applied)
	if out.EventID != contract.EventID("w", 2, contract.KindWithdrawn) {
		t.Fatal("withdrawal event id is not derived")
	}
	out, err = s.Withdraw(ctx, "w", 2)
	mustResult(out, err, docstore.Unchanged)
	// A replayed older upsert must not resurrect the document.
	out, err = s.Put(ctx, doc("w", 1, "body\n\nmore"))
	mustResult(out, err, docstore.Stale)
	// The withdrawn version with content is a conflict.
	if _, err := s.Put(ctx, doc("w", 2, "x")); !errors.Is(err, docstore.ErrVersionConflict) {
		t.Fatalf("upsert at the tombstone's version: %v", err)
	}
	rec, err := s.Get(ctx, "w")
	if err != nil || !rec.Withdrawn || rec.Version != 2 || rec.Body != "" || rec.Chunks != 0 {
		t.Fatalf("tombstone %+v, %v", rec, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM chunks WHERE key = 'w'`); n != 0 {
		t.Fatalf("%d chunks left after withdrawal", n)
	}
	// Withdrawing a key never seen stores a tombstone, so an upsert that
	// arrives later and older stays out.
	out, err = s.Withdraw(ctx, "never", 5)
	mustResult(out, err, docstore.Applied)
	out, err = s.Put(ctx, doc("never", 4, "late"))
	mustResult(out, err, docstore.Stale)
	// A newer version brings a document back on purpose.
	out, err = s.Put(ctx, doc("w", 3, "back"))
	mustResult(out, err, docstore.Applied)
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE key = 'w'`); n != 3 {
		t.Fatalf("outbox holds %d events for w, want 3", n)
	}
}

func TestOutboxCarriesTheCanonicalEvent(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	body := strings.Repeat("A paragraph of text that goes on.\n\n", 200)
	d := doc("e", 7, body)
	if _, err := s.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	var payload string
	if err := pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE key = 'e'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	ev, err := contract.DecodeEvent([]byte(payload))
	if err != nil {
		t.Fatalf("outbox payload does not decode: %v", err)
	}
	if ev.Body() != body || len(ev.Chunks) < 2 {
		t.Fatalf("event body/chunks wrong: %d chunks", len(ev.Chunks))
	}
	norm, _ := d.Normalize()
	if ev.ContentHash != contract.ContentHash(norm) {
		t.Fatal("event content hash differs from the document's")
	}
	if n := count(t, pool, `SELECT count(*) FROM chunks WHERE key = 'e'`); n != len(ev.Chunks) {
		t.Fatalf("%d chunk rows, event has %d", n, len(ev.Chunks))
	}
	var bad int
	for _, c := range ev.Chunks {
		bad += count(t, pool, `SELECT count(*) FROM chunks WHERE id = $1 AND (ordinal <> $2 OR text <> $3 OR content_hash <> $4)`, c.ID, c.Ordinal, c.Text, c.Hash)
	}
	if bad != 0 {
		t.Fatalf("%d chunk rows differ from the event", bad)
	}
}

// An outbox payload is compressed with lz4 where the server has it
// (migration 5), pglz otherwise.
func TestOutboxPayloadCompressedWithLZ4(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	want := "pglz"
	if pg.HasLZ4(t) {
		want = "lz4"
	}
	// Past the threshold (~2 KB) where Postgres compresses a row's values.
	body := strings.Repeat("A paragraph of text that goes on.\n\n", 100)
	if _, err := s.Put(ctx, doc("p", 1, body)); err != nil {
		t.Fatal(err)
	}
	var (
		compression  *string
		stored, text int
	)
	err := pool.QueryRow(ctx, `SELECT pg_column_compression(payload), pg_column_size(payload), octet_length(payload::text)
		FROM outbox WHERE key = 'p'`).Scan(&compression, &stored, &text)
	if err != nil {
		t.Fatal(err)
	}
	if deref(compression) != want || stored >= text {
		t.Errorf("a %d-byte payload is stored in %d bytes, compression %s; want %s", text, stored, deref(compression), want)
	}
}

func deref(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}

func TestBatchWithRepeatedKeysAndBadLines(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	writes := []docstore.Write{
		{Doc: doc("b", 2, "two")},
		{Doc: doc("b", 1, "one")},
		{Doc: contract.Document{Key: "", Version: 1}},
		{Doc: doc("b", 2, "two")},
		{Doc: doc("c", 1, "c1")},
		{Doc: doc("b", 3, "three")},
		{Doc: contract.Document{Key: "c", Version: 2}, Withdraw: true},
		{Doc: doc("b", 3, "other")},
	}
	outs, err := s.Apply(ctx, writes)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"applied", "stale", contract.CodeMissingKey, "unchanged", "applied", "applied", "applied", "conflict"}
	for i, o := range outs {
		got := string(o.Result)
		var ve *contract.ValidationError
		switch {
		case errors.As(o.Err, &ve):
			got = ve.Code
		case errors.Is(o.Err, docstore.ErrVersionConflict):
			got = "conflict"
		case o.Err != nil:
			t.Fatalf("line %d: %v", i, o.Err)
		}
		if got != want[i] {
			t.Errorf("write %d (%s v%d): %s, want %s", i, o.Key, o.Version, got, want[i])
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 4 {
		t.Fatalf("outbox rows %d, want 4", n)
	}
	rec, _ := s.Get(ctx, "b")
	if rec.Version != 3 || rec.Body != "three" {
		t.Fatalf("b = %+v", rec)
	}
}

// Many writers racing on the same keys with versions in random order must
// converge to the highest version, with one outbox event per applied
// version and no error surfaced for valid writes (deadlocks are retried).
func TestConcurrentWritersConverge(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	const (
		writers  = 8
		keys     = 6
		versions = 40
	)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var all []docstore.Write
			for k := range keys {
				for v := 1; v <= versions; v++ {
					all = append(all, docstore.Write{Doc: doc(fmt.Sprintf("k%d", k), int64(v), fmt.Sprintf("body of k%d at %d", k, v))})
				}
			}
			rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
			for len(all) > 0 {
				n := min(len(all), 1+rng.IntN(20))
				outs, err := s.Apply(ctx, all[:n])
				if err != nil {
					errs <- err
					return
				}
				for _, o := range outs {
					if o.Err != nil {
						errs <- o.Err
						return
					}
				}
				all = all[n:]
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM documents WHERE version = $1`, versions); n != keys {
		t.Fatalf("%d of %d documents at version %d", n, keys, versions)
	}
	if n := count(t, pool, `SELECT count(*) FROM (SELECT key, version FROM outbox GROUP BY key, version HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d (key, version) pairs with more than one event", n)
	}
	assertChunksMatchDocuments(t, pool)
	// Every event in the outbox is for a version that was applied at the
	// time, so events for a key are strictly increasing in commit order;
	// the last one is the final version.
	if n := count(t, pool, `SELECT count(DISTINCT key) FROM outbox WHERE version = $1`, versions); n != keys {
		t.Fatalf("final versions missing from the outbox: %d of %d", n, keys)
	}
}

func TestRetryable(t *testing.T) {
	if docstore.Retryable(errors.New("boom")) {
		t.Fatal("a plain error is not retryable")
	}
	if docstore.Retryable(context.Canceled) {
		t.Fatal("cancellation is not retryable")
	}
}

// Two versions of one key written at the same moment: whichever wins, the
// chunks table must hold exactly the winner's chunks.
func TestConcurrentVersionsLeaveNoStaleChunks(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	body := func(key string, v int) string {
		return strings.Repeat(fmt.Sprintf("Version %d of %s, a paragraph long enough to fill chunks.\n\n", v, key), 60)
	}
	const keys = 100
	for round := range 2 {
		var wg sync.WaitGroup
		errs := make(chan error, 2*keys)
		for k := range keys {
			key := fmt.Sprintf("race-%d", k)
			for _, v := range []int{2*round + 2, 2*round + 3} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := s.Put(ctx, doc(key, int64(v), body(key, v))); err != nil {
						errs <- err
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		assertChunksMatchDocuments(t, pool)
	}
}

func assertChunksMatchDocuments(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	bad := count(t, pool, `
		SELECT count(*) FROM documents d
		WHERE d.chunk_count <> (SELECT count(*) FROM chunks c WHERE c.key = d.key)
		   OR EXISTS (SELECT 1 FROM chunks c WHERE c.key = d.key AND c.version <> d.version)`)
	if bad != 0 {
		t.Fatalf("%d documents whose chunk rows are not exactly their current version's", bad)
	}
}

func TestPruneOutboxDeletesOnlyOldRowsInBatches(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	var writes []docstore.Write
	for i := range 30 {
		writes = append(writes, docstore.Write{Doc: doc(fmt.Sprintf("p%d", i), 1, "x")})
	}
	if _, err := s.Apply(ctx, writes); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '2 days' WHERE key < 'p2'`); err != nil {
		t.Fatal(err)
	}
	old := count(t, pool, `SELECT count(*) FROM outbox WHERE created_at < now() - interval '1 day'`)
	if old < 10 {
		t.Fatalf("setup: only %d old rows", old)
	}
	n, err := s.PruneOutbox(ctx, 24*time.Hour, 5)
	if err != nil || n != 5 {
		t.Fatalf("first batch deleted %d (%v), want 5", n, err)
	}
	for n == 5 {
		if n, err = s.PruneOutbox(ctx, 24*time.Hour, 5); err != nil {
			t.Fatal(err)
		}
	}
	if left := count(t, pool, `SELECT count(*) FROM outbox`); left != 30-old {
		t.Fatalf("%d rows left, want %d (only the old ones deleted)", left, 30-old)
	}
	// Documents and chunks are untouched by retention.
	if docs := count(t, pool, `SELECT count(*) FROM documents`); docs != 30 {
		t.Fatalf("documents %d", docs)
	}
}
