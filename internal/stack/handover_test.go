package stack_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	vpostgres "github.com/converge-sync/converge/internal/verify/postgres"
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
	cfg := stack.Config{Log: slog.New(slog.DiscardHandler), LogOut: io.Discard}
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr, &cfg.NotifierAddr} {
		addr, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*a = addr
	}
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
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
	testenv.Eventually(t, "the inbox drained by the restarting writers", 3*time.Minute, func() bool {
		var pending int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM converge_inbox`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
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
	testenv.Eventually(t, "the stream to hold every event of the outbox", 3*time.Minute, func() bool {
		var all uint64
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&all); err != nil {
			t.Fatal(err)
		}
		return streamMsgs(t, s) == all
	})
	testenv.Eventually(t, "verify to agree", 3*time.Minute, func() bool {
		res, err := verify.Run(ctx, &vpostgres.Postgres{Pool: admin}, []verify.Projection{
			{Kind: verify.Index, Side: &verify.Remote{Label: "index", Addr: s.IndexAddr, Token: s.OperatorToken}},
			{Kind: verify.Graph, Side: &verify.Remote{Label: "graph", Addr: s.GraphAddr, Token: s.OperatorToken}},
		}, verify.DefaultBuckets, nil)
		return err == nil && res.Agrees
	})
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
