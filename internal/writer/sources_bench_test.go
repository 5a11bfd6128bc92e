package writer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/internal/writer"
)

// BenchmarkSource measures, in one run, a mapped table's changes through
// the writer (10,000 rows inserted in one statement, then all of them
// updated in one statement: from the statement's commit to the last
// document stored) against the same number of documents handed over in
// converge_inbox (100 per producer transaction, four producers), one
// writer draining both ways. It reports the rates and their ratio.
func BenchmarkSource(b *testing.B) {
	const n, per, producers = 10000, 100, 4
	body := strings.Repeat("A row of a table the team already has, mapped to a document. ", 8)
	for range b.N {
		e := newEnv(b)
		ctx, cancel := context.WithCancel(context.Background())
		in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, discardLogger())
		drained := make(chan struct{})
		go func() { _ = in.Run(ctx); close(drained) }()
		stop := func() { cancel(); <-drained }
		b.Cleanup(stop) // before the pool closes, after a failure too
		waitEmpty := func() {
			for count(b, e, `SELECT count(*) FROM converge_inbox`) > 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}

		start := time.Now()
		var g errgroup.Group
		for p := range producers {
			g.Go(func() error {
				for lo := p * per; lo < n; lo += producers * per {
					keys, docs := make([]string, 0, per), make([]string, 0, per)
					for i := lo; i < lo+per; i++ {
						d, _ := json.Marshal(map[string]any{"version": 1, "title": fmt.Sprintf("doc %d", i), "body": body})
						keys, docs = append(keys, fmt.Sprintf("handed/%05d", i)), append(docs, string(d))
					}
					if _, err := e.pool.Exec(ctx, `INSERT INTO converge_inbox (key, document) SELECT * FROM unnest($1::text[], $2::json[])`, keys, docs); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		waitEmpty()
		handed := float64(n) / time.Since(start).Seconds()

		if _, err := e.pool.Exec(ctx, `CREATE TABLE bench_rows (id int PRIMARY KEY, title text, body text)`); err != nil {
			b.Fatal(err)
		}
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := source.Apply(ctx, conn.Conn(), source.Mapping{Name: "rows", Table: "bench_rows", Title: "title", Body: "body"}, false); err != nil {
			b.Fatal(err)
		}
		conn.Release()
		start = time.Now()
		if _, err := e.pool.Exec(ctx, `INSERT INTO bench_rows SELECT i, 'row ' || i, $1 FROM generate_series(1, $2::int) i`, body, n); err != nil {
			b.Fatal(err)
		}
		waitEmpty()
		inserted := float64(n) / time.Since(start).Seconds()
		start = time.Now()
		if _, err := e.pool.Exec(ctx, `UPDATE bench_rows SET body = body || ' Updated.'`); err != nil {
			b.Fatal(err)
		}
		waitEmpty()
		updated := float64(n) / time.Since(start).Seconds()
		if got := count(b, e, `SELECT count(*) FROM documents WHERE key LIKE 'rows/%' AND version = 2`); got != n {
			b.Fatalf("%d rows' documents at version 2, want %d", got, n)
		}
		b.ReportMetric(inserted, "inserted_rows/s")
		b.ReportMetric(updated, "updated_rows/s")
		b.ReportMetric(handed, "handed_over_docs/s")
		b.ReportMetric(updated/handed, "ratio")
		b.Logf("a mapped table through the writer: %.0f rows/s inserted, %.0f rows/s updated (10,000 in one statement each), against %.0f documents/s handed over in converge_inbox: ratio %.2f (update / handed over)",
			inserted, updated, handed, updated/handed)
	}
}
