package stack_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/writer"
)

// Eight producer connections hand 10,000 documents over in SQL while the
// writers that drain the inbox are stopped mid-transaction and started
// again, over and over (the stack's own writer drains nothing: -inbox
// false): every document is applied exactly once (one outbox row each),
// the documents' stream holds every event of the outbox, and verify
// agrees on the index and the graph.
func TestHandedOverWhileWritersRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	t.Setenv("CONVERGE_WRITER_INBOX", "false")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := startStack(t, ctx)
	admin, err := pgxpool.New(ctx, s.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	producer, err := pgxpool.New(ctx, s.ProducerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	wpool, err := pgxpool.New(ctx, s.WriterURL)
	if err != nil {
		t.Fatal(err)
	}
	defer wpool.Close()
	store, err := docstore.New(wpool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Two writers' drains, each stopped every 50 to 250 ms (its
	// transaction cancelled wherever it is) and started again.
	var restarts atomic.Int32
	stopDrains := make(chan struct{})
	var drains sync.WaitGroup
	for w := range 2 {
		drains.Add(1)
		go func() {
			defer drains.Done()
			for i := 0; ; i++ {
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan struct{})
				in := writer.NewInbox(wpool, store, writer.InboxConfig{BatchSize: 64 * (w + 1)}, nil, nil)
				go func() { _ = in.Run(runCtx); close(done) }()
				select {
				case <-stopDrains:
					stop()
					<-done
					return
				case <-time.After(time.Duration(50+(i*37+w*91)%200) * time.Millisecond):
				}
				stop()
				<-done
				restarts.Add(1)
			}
		}()
	}
	start := time.Now()
	var g errgroup.Group
	for p := range 8 {
		g.Go(func() error {
			for lo := p * 50; lo < 10000; lo += 8 * 50 {
				keys, docs := make([]string, 0, 50), make([]string, 0, 50)
				for i := lo; i < lo+50; i++ {
					keys = append(keys, fmt.Sprintf("handed/%05d", i))
					docs = append(docs, fmt.Sprintf(`{"version": 1, "title": "handed %d", "body": "A document handed over while writers restart, number %d."}`, i, i))
				}
				if _, err := producer.Exec(ctx, `INSERT INTO converge_inbox (key, document) SELECT * FROM unnest($1::text[], $2::json[])`, keys, docs); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	waitInboxDrained(t, ctx, admin, "the restarting writers")
	close(stopDrains)
	drains.Wait()
	var stored, outbox int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM documents WHERE key LIKE 'handed/%' AND version = 1),
		(SELECT count(*) FROM outbox WHERE key LIKE 'handed/%')`).Scan(&stored, &outbox); err != nil {
		t.Fatal(err)
	}
	if stored != 10000 || outbox != 10000 {
		t.Fatalf("%d documents stored and %d outbox rows, want 10000 each: each applied once", stored, outbox)
	}
	waitStreamHoldsOutbox(t, ctx, s, admin)
	waitAgrees(t, ctx, s, admin, "after the hand-over")
	// The stack's own writer drained none of them: the restarting
	// writers did it all.
	if n := scrapeMetrics(t, s.WriterAddr).Sum("converge_writer_documents_total", telemetry.Labels{"source": "inbox"}); n != 0 {
		t.Fatalf("the stack's writer (-inbox false) applied %v handed-over documents", n)
	}
	if restarts.Load() < 4 {
		t.Fatalf("the writers restarted %d times while documents were handed over", restarts.Load())
	}
	t.Logf("10,000 documents from 8 producers through writers restarted %d times: applied once each, relayed, verify agrees, %v", restarts.Load(), time.Since(start).Round(time.Millisecond))
}
