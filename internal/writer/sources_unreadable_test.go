package writer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

// A source whose view cannot be read whatever the row (a table its
// function reads was dropped) refuses none of its rows: they stay
// pending, the batch's other rows (another source's, a document handed
// over) are applied, the metric says which source, and once the table is
// back the rows are applied at the source's next attempt, without a
// producer's commit to wake the drain.
func TestSourceWhoseViewCannotBeReadLeavesItsRowsPending(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE bodies (id int PRIMARY KEY, body text);
		INSERT INTO bodies VALUES (1, 'one'), (2, 'two');
		CREATE FUNCTION note_body(n int) RETURNS text LANGUAGE plpgsql STABLE AS $$
		BEGIN RETURN (SELECT body FROM bodies WHERE id = n); END $$;
		CREATE TABLE notes (id int PRIMARY KEY);
		CREATE TABLE tasks (id int PRIMARY KEY, body text);`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "notes", Table: "notes", Body: "note_body(id)"})
	applySource(t, e, source.Mapping{Name: "tasks", Table: "tasks", Body: "body"})
	if _, err := e.pool.Exec(ctx, `DROP TABLE bodies;
		INSERT INTO notes VALUES (1), (2);
		INSERT INTO tasks VALUES (1, 'a task');
		INSERT INTO converge_inbox (key, document) VALUES ('handed', '{"version": 1, "title": "t", "body": "handed over"}')`); err != nil {
		t.Fatal(err)
	}
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 2, RetryMin: time.Second, RetryMax: time.Second}, e.metrics, nil)
	if _, err := in.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q: a view that cannot be read refuses no row", got)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox WHERE source = 'notes' AND refused_at IS NULL`); n != 2 {
		t.Fatalf("%d of notes' 2 rows pending", n)
	}
	if n := count(t, e, `SELECT count(*) FROM documents WHERE key IN ('tasks/1', 'handed') AND NOT deleted`); n != 2 {
		t.Fatalf("%d of the other source's row and the handed-over document applied, want 2", n)
	}
	if v := testutil.ToFloat64(e.metrics.InboxSourceUnreadable.WithLabelValues("notes")); v != 1 {
		t.Fatalf("converge_writer_inbox_source_unreadable{source=notes} is %v, want 1", v)
	}

	if _, err := e.pool.Exec(ctx, `CREATE TABLE bodies (id int PRIMARY KEY, body text); INSERT INTO bodies VALUES (1, 'one'), (2, 'two')`); err != nil {
		t.Fatal(err)
	}
	// The drain's first pass, at once, leaves notes out until its next
	// attempt, a second after the failure: the rows are applied then, with
	// no producer committing to wake the drain.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	if n := count(t, e, `SELECT count(*) FROM documents WHERE key IN ('notes/1', 'notes/2')`); n != 0 {
		t.Fatalf("%d of notes' rows applied before the source's next attempt", n)
	}
	testenv.Eventually(t, "notes' rows applied once the table is back", 20*time.Second, func() bool {
		return count(t, e, `SELECT count(*) FROM documents WHERE key IN ('notes/1', 'notes/2') AND NOT deleted`) == 2
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox`); n != 0 {
		t.Errorf("%d rows left in converge_inbox", n)
	}
	if v := testutil.ToFloat64(e.metrics.InboxSourceUnreadable.WithLabelValues("notes")); v != 0 {
		t.Errorf("converge_writer_inbox_source_unreadable{source=notes} is %v once read, want 0", v)
	}
}

// A row that takes a key another source's row gives, when that source's
// view cannot be read, waits for it: the drain returns (it does not take
// the row again and again), nothing is refused, and the row is applied
// once the view reads again.
func TestSourceRowWaitingForAnUnreadableSourceDoesNotSpin(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE slugs (id int PRIMARY KEY, slug text);
		INSERT INTO slugs VALUES (1, 'k');
		CREATE FUNCTION b_slug(n int) RETURNS text LANGUAGE plpgsql STABLE AS $$
		BEGIN RETURN (SELECT slug FROM slugs WHERE id = n); END $$;
		CREATE TABLE a (id int PRIMARY KEY, slug text);
		CREATE TABLE b (id int PRIMARY KEY);
		INSERT INTO b VALUES (1);`); err != nil {
		t.Fatal(err)
	}
	applySource(t, e, source.Mapping{Name: "b", Table: "b", Key: "b_slug(id)", Body: "'b'"})
	drainAll(t, e)
	if n := count(t, e, `SELECT count(*) FROM documents WHERE key = 'k' AND NOT deleted`); n != 1 {
		t.Fatalf("b's row gave no document k")
	}
	applySource(t, e, source.Mapping{Name: "a", Table: "a", Key: "slug", Body: "'a'"})
	// b's row gives k up (its view now fails), and a's takes it: a's row
	// must read b's to settle k.
	if _, err := e.pool.Exec(ctx, `DROP TABLE slugs; UPDATE b SET id = 1 WHERE id = 1; INSERT INTO a VALUES (1, 'k')`); err != nil {
		t.Fatal(err)
	}
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1, RetryMin: time.Second, RetryMax: time.Second}, e.metrics, nil)
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	if _, err := in.Drain(dctx); err != nil {
		t.Fatalf("drain: %v (it must return while b cannot be read)", err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q while b cannot be read", got)
	}
	if n := count(t, e, `SELECT count(*) FROM converge_inbox WHERE refused_at IS NULL`); n != 2 {
		t.Fatalf("%d rows pending, want a's and b's", n)
	}
	if v := testutil.ToFloat64(e.metrics.InboxSourceUnreadable.WithLabelValues("b")); v != 1 {
		t.Fatalf("converge_writer_inbox_source_unreadable{source=b} is %v, want 1", v)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE slugs (id int PRIMARY KEY, slug text); INSERT INTO slugs VALUES (1, 'gone')`); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	testenv.Eventually(t, "a's row applied with k once b reads again", 20*time.Second, func() bool {
		return count(t, e, `SELECT count(*) FROM documents WHERE key = 'gone' AND NOT deleted`) == 1 &&
			count(t, e, `SELECT count(*) FROM converge_inbox`) == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := refusals(t, e); len(got) != 0 {
		t.Fatalf("refused %q", got)
	}
}
