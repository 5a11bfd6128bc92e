package writer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

func applySource(t *testing.T, e *env, m source.Mapping) source.Result {
	t.Helper()
	conn, err := e.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	res, err := source.Apply(context.Background(), conn.Conn(), m, false)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Eight producers update ten rows of a mapped table at once while three
// writers drain concurrently, each with parallel transactions: every
// row's documents have versions 1, 2, 3, ... whose contents follow the
// row's commits (its counter only grows from one version to the next),
// and the last is the row as it stands.
func TestSourceVersionsFollowCommits(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters SELECT i, 0 FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "counters", Table: "counters", Body: "'n=' || n"})

	drainCtx, stopDrains := context.WithCancel(ctx)
	var drains sync.WaitGroup
	for range 3 {
		in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{BatchSize: 4, Parallel: 3}, e.metrics, nil)
		drains.Add(1)
		go func() {
			defer drains.Done()
			for drainCtx.Err() == nil {
				if _, err := in.Drain(drainCtx); err != nil && drainCtx.Err() == nil {
					t.Errorf("drain: %v", err)
					return
				}
			}
		}()
	}
	var g errgroup.Group
	for p := range 8 {
		g.Go(func() error {
			r := rand.New(rand.NewPCG(uint64(p), 1)) //nolint:gosec // a test's choice of rows
			for range 150 {
				if _, err := e.pool.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = $1`, 1+r.IntN(10)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	stopDrains()
	drains.Wait()
	if _, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, nil).Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox`); n != 0 {
		t.Fatalf("%d rows left in the inbox", n)
	}
	rows, err := e.pool.Query(ctx, `SELECT key, version, payload::text FROM outbox ORDER BY key, version`)
	if err != nil {
		t.Fatal(err)
	}
	counter := regexp.MustCompile(`n=(\d+)`)
	last := map[string][2]int64{} // version, n
	var key, payload string
	var version int64
	versions := 0
	if _, err := pgx.ForEachRow(rows, []any{&key, &version, &payload}, func() error {
		m := counter.FindStringSubmatch(payload)
		if m == nil {
			return fmt.Errorf("%s v%d: no counter in %s", key, version, payload)
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		prev, seen := last[key]
		switch {
		case !seen && version != 1:
			return fmt.Errorf("%s: first version %d", key, version)
		case seen && version != prev[0]+1:
			return fmt.Errorf("%s: version %d after %d", key, version, prev[0])
		case seen && n <= prev[1]:
			return fmt.Errorf("%s: version %d has n=%d, after n=%d at version %d: not in commit order", key, version, n, prev[1], prev[0])
		}
		last[key] = [2]int64{version, n}
		versions++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 10; id++ {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT n FROM counters WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if got := last[fmt.Sprintf("counters/%d", id)]; got[1] != n {
			t.Errorf("counters/%d: last version %d has n=%d, the row has %d", id, got[0], got[1], n)
		}
	}
	t.Logf("1,200 updates of 10 rows gave %d versions, each newer than the last", versions)
}

// What the writer cannot apply stays in the inbox with its reason: a
// source without a view it may read, a row whose document is invalid, a
// row giving a key another row gives; the others of the batch are
// applied.
func TestSourceRefusalsAreKept(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (1, 'a', 'fine'), (2, '', 'empty key'), (3, 'c', 'fine too'), (4, 'c', 'the same key as 3')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	if _, err := e.pool.Exec(ctx, `INSERT INTO converge_inbox (source, row_id) VALUES ('nosuch', '1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1}, e.metrics, nil).Drain(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, `SELECT source, row_id, refused_code, refused_message FROM converge_inbox ORDER BY source, row_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var src, row, code, msg string
	if _, err := pgx.ForEachRow(rows, []any{&src, &row, &code, &msg}, func() error {
		got = append(got, fmt.Sprintf("%s %s %s: %s", src, row, code, msg))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`^nosuch 1 unknown_source: .*no view converge_source_nosuch the writer may read`),
		regexp.MustCompile(`^notes 2 missing_key: `),
		regexp.MustCompile(`^notes 4 duplicate_key: .*row 4 of source notes gives key "c", which row 3 of source notes gives already`),
	}
	if len(got) != len(want) {
		t.Fatalf("refused:\n%q\nwant %d", got, len(want))
	}
	for i, w := range want {
		if !w.MatchString(got[i]) {
			t.Errorf("refusal %d: %q, want %s", i, got[i], w)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM documents WHERE key IN ('a', 'c') AND NOT deleted`); n != 2 {
		t.Errorf("%d of the valid rows' documents stored, want 2", n)
	}
}

// drainAll drains the inbox with one transaction at a time, and fails the
// test on an error: nothing a row holds may stop the drain.
func drainAll(t *testing.T, e *env) {
	t.Helper()
	if _, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1}, e.metrics, nil).Drain(context.Background()); err != nil {
		t.Fatalf("drain: %v", err)
	}
}

// waitBatches waits until the inbox's drain has committed n batches (each
// observed in its transaction's latency): what a batch did, a row
// refused, applied or left pending, is in the database then.
func waitBatches(t *testing.T, m *writer.Metrics, n uint64) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%d inbox batches committed", n), 10*time.Second, func() bool {
		var d dto.Metric
		if err := m.TxSeconds.WithLabelValues("inbox").(prometheus.Histogram).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetHistogram().GetSampleCount() >= n
	})
}

// refusals are the inbox's refused rows, "source row_id code".
func refusals(t *testing.T, e *env) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT coalesce(source, key), coalesce(row_id, ''), refused_code FROM converge_inbox WHERE refused_at IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var s, r, c string
	if _, err := pgx.ForEachRow(rows, []any{&s, &r, &c}, func() error { out = append(out, s+" "+r+" "+c); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// A row whose document the view cannot give (meta that is not JSON, an
// identity that is not one) is refused alone: the rest of the batch is
// applied, and the drain goes on. A NULL among the tags is left out.
func TestSourceRowThatCannotBeReadIsRefusedAlone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id bigint PRIMARY KEY, body text, extra text, cat text);
		INSERT INTO notes VALUES (1, 'fine', '{"a": 1}', NULL), (2, 'bad meta', 'not json', 'x'), (3, 'fine too', '{}', 'y')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Body: "body", Meta: "extra::jsonb", Tags: "ARRAY[cat]"})
	if _, err := e.pool.Exec(ctx, `INSERT INTO converge_inbox (source, row_id) VALUES ('notes', 'abc')`); err != nil {
		t.Fatal(err)
	}
	drainAll(t, e)
	got := refusals(t, e)
	if len(got) != 2 || got[0] != "notes 2 row_unreadable" || got[1] != "notes abc row_unreadable" {
		t.Fatalf("refused %q, want rows 2 and abc unreadable", got)
	}
	if n := count(t, e, `SELECT count(*) FROM documents WHERE key IN ('notes/1', 'notes/3') AND NOT deleted`); n != 2 {
		t.Fatalf("%d of the readable rows applied, want 2", n)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox WHERE refused_at IS NULL`); n != 0 {
		t.Fatalf("%d rows left pending", n)
	}
}

// Rows that give up a key and rows that take it in one transaction: a row
// deleted and another inserted with its key, two rows trading keys. The
// documents follow, at their next versions, and nothing is refused.
func TestSourceKeysMoveBetweenRowsInOneTransaction(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (1, 'a', 'first a'), (3, 'c', 'cee'), (4, 'd', 'dee')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	if _, err := e.pool.Exec(ctx, `BEGIN;
		DELETE FROM notes WHERE id = 1; INSERT INTO notes VALUES (2, 'a', 'second a');
		UPDATE notes SET slug = CASE slug WHEN 'c' THEN 'd' ELSE 'c' END WHERE id IN (3, 4);
		COMMIT`); err != nil {
		t.Fatal(err)
	}
	drainAll(t, e)
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
	for key, want := range map[string]string{"a": "second a", "c": "dee", "d": "cee"} {
		rec, err := e.store.Get(ctx, key)
		if err != nil || rec.Withdrawn || rec.Version != 2 || rec.Body != want {
			t.Errorf("%s: %+v, %v; want %q at version 2", key, rec, err, want)
		}
	}
}

// A key handed over as a document and given by a source's row in one
// batch: the document first, then the row's at the next version; nothing
// refused, nothing silently lost.
func TestSourceRowAndDocumentOfOneKeyInOneBatch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, body text)`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "'x'", Body: "body"})
	if _, err := e.pool.Exec(ctx, `BEGIN;
		INSERT INTO converge_inbox (key, document) VALUES ('x', '{"version": 1, "body": "handed over"}');
		INSERT INTO notes VALUES (1, 'from the table');
		COMMIT`); err != nil {
		t.Fatal(err)
	}
	drainAll(t, e)
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
	rec, err := e.store.Get(ctx, "x")
	if err != nil || rec.Version != 2 || rec.Body != "from the table" {
		t.Fatalf("x: %+v, %v; want the row's document at version 2", rec, err)
	}
}

// No source's view takes the name of one of converge's tables: a source
// named rows (converge_source_rows) is applied and followed.
func TestASourceNamedRows(t *testing.T) {
	e := newEnv(t)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE things (id int PRIMARY KEY, body text); INSERT INTO things VALUES (1, 'a thing')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "rows", Table: "things", Body: "body"})
	drainAll(t, e)
	if rec, err := e.store.Get(context.Background(), "rows/1"); err != nil || rec.Body != "a thing" {
		t.Fatalf("rows/1: %+v, %v", rec, err)
	}
}

// Two rows trading keys, taken in separate batches: the key's recorded
// row, outside the batch, no longer gives it, so its change is applied in
// the same batch; nothing is refused and both documents follow.
func TestSourceKeysTradedAcrossBatches(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (3, 'c', 'cee'), (4, 'd', 'dee')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	if _, err := e.pool.Exec(ctx, `UPDATE notes SET slug = CASE slug WHEN 'c' THEN 'd' ELSE 'c' END`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1, BatchSize: 1}, e.metrics, nil).Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
	for key, want := range map[string]string{"c": "dee", "d": "cee"} {
		if rec, err := e.store.Get(ctx, key); err != nil || rec.Withdrawn || rec.Body != want {
			t.Errorf("%s: %+v, %v; want %q", key, rec, err, want)
		}
	}
}

// A row refused while it gives up a key another row of the batch takes:
// the key is not released (the other row is refused too, as a duplicate of
// the refused row's recorded key), and the drain goes on, never failing
// at commit on the keys' uniqueness.
func TestSourceRefusedRowKeepsTheKeyItGaveUp(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (1, 'a', 'one'), (3, 'x', 'ex')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	if _, err := e.pool.Exec(ctx, `BEGIN; UPDATE notes SET slug = 'x' WHERE id = 1; INSERT INTO notes VALUES (4, 'a', 'four'); COMMIT`); err != nil {
		t.Fatal(err)
	}
	drainAll(t, e)
	drainAll(t, e) // again: nothing left to fail on
	got := refusals(t, e)
	if len(got) != 2 || got[0] != "notes 1 duplicate_key" || got[1] != "notes 4 duplicate_key" {
		t.Fatalf("refused %q, want rows 1 and 4 as duplicates", got)
	}
	for key, want := range map[string]string{"a": "one", "x": "ex"} {
		if rec, err := e.store.Get(ctx, key); err != nil || rec.Withdrawn || rec.Body != want {
			t.Errorf("%s: %+v, %v; want %q unchanged", key, rec, err, want)
		}
	}
}

// A row moving to a new key while the row taking its old key is refused
// (its document too large): the old key is withdrawn, not left live with
// no row giving it.
func TestSourceKeyGivenUpToARefusedRowIsWithdrawn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (1, 'a', 'one')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	if _, err := e.pool.Exec(ctx, `BEGIN; UPDATE notes SET slug = 'b' WHERE id = 1;
		INSERT INTO notes VALUES (2, 'a', repeat('"', 4190000)); COMMIT`); err != nil {
		t.Fatal(err)
	}
	drainAll(t, e)
	if got := refusals(t, e); len(got) != 1 || got[0] != "notes 2 event_too_large" {
		t.Fatalf("refused %q, want row 2 alone (event_too_large)", got)
	}
	if rec, err := e.store.Get(ctx, "a"); err != nil || !rec.Withdrawn {
		t.Fatalf("a: %+v, %v; want withdrawn (no row gives it)", rec, err)
	}
	if rec, err := e.store.Get(ctx, "b"); err != nil || rec.Body != "one" {
		t.Fatalf("b: %+v, %v", rec, err)
	}
}

// A key recorded for a row outside the batch whose lock another
// transaction holds (another writer applying that row's change) is not
// refused: the batch's rows wait, pending, and are applied once that
// transaction has ended.
func TestSourceRowHeldElsewhereIsLeftForLater(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (3, 'c', 'cee'), (4, 'd', 'dee')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	if _, err := e.pool.Exec(ctx, `UPDATE notes SET slug = CASE slug WHEN 'c' THEN 'd' ELSE 'c' END`); err != nil {
		t.Fatal(err)
	}
	// The row a batch of one takes first, and the other one, held.
	var first string
	if err := e.pool.QueryRow(ctx, `SELECT row_id FROM converge_inbox ORDER BY id LIMIT 1`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	held := map[string]string{"3": "4", "4": "3"}[first]
	other, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck
	if _, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, writer.SourceLockClass, writer.SourceRowLock("notes", held)); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	metrics := writer.NewMetrics(nil) // the drain's batches alone, counted from none
	go func() {
		_, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1, BatchSize: 1}, metrics, nil).Drain(dctx)
		drained <- err
	}()
	waitBatches(t, metrics, 1) // the batch committed: what it did is in the database
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q while the other row was held", got)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox`); n != 2 {
		t.Fatalf("%d rows pending while the other row was held, want both", n)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
	for key, want := range map[string]string{"c": "dee", "d": "cee"} {
		if rec, err := e.store.Get(ctx, key); err != nil || rec.Body != want {
			t.Errorf("%s: %+v, %v; want %q", key, rec, err, want)
		}
	}
}

// A row that takes the key another row of its batch gives up, while that
// one waits for a row another transaction holds, waits with it instead of
// being refused as a duplicate.
func TestSourceRowTakingTheKeyOfADeferredRowWaits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY, slug text, body text);
		INSERT INTO notes VALUES (3, 'a', 'three'), (4, 'b', 'four'), (5, 'z', 'five')`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Key: "slug", Body: "body"})
	drainAll(t, e)
	// One batch of two: row 3 takes b from row 4 (outside the batch, held
	// elsewhere), row 5 takes a from row 3; row 4's own change comes after.
	if _, err := e.pool.Exec(ctx, `UPDATE notes SET slug = CASE id WHEN 3 THEN 'b' ELSE 'a' END WHERE id IN (3, 5)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE notes SET slug = 'y' WHERE id = 4`); err != nil {
		t.Fatal(err)
	}
	other, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck
	if _, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, writer.SourceLockClass, writer.SourceRowLock("notes", "4")); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	metrics := writer.NewMetrics(nil) // the drain's batches alone, counted from none
	go func() {
		_, err := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1, BatchSize: 2}, metrics, nil).Drain(dctx)
		drained <- err
	}()
	waitBatches(t, metrics, 1) // the batch committed: what it did is in the database
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q while row 4 was held", got)
	}
	if n := testutil.ToFloat64(metrics.Documents.WithLabelValues("inbox", "")); n != 0 {
		t.Fatalf("%v rows left pending counted as documents without an outcome", n)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox`); n != 3 {
		t.Fatalf("%d rows pending while row 4 was held, want all 3", n)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
	for key, want := range map[string]string{"a": "five", "b": "three", "y": "four"} {
		if rec, err := e.store.Get(ctx, key); err != nil || rec.Body != want {
			t.Errorf("%s: %+v, %v; want %q", key, rec, err, want)
		}
	}
}
