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
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{Parallel: 1, RetryMin: 200 * time.Millisecond, RetryMax: 200 * time.Millisecond}, e.metrics, nil)
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
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
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
