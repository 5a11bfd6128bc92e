package docstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

// xidTarget is the write rate with outbox.xid (its default and index,
// schema 7) over the rate without, at least.
const xidTarget = 0.95

// BenchmarkOutboxXid measures what schema 7 costs the write path: each
// outbox row takes pg_current_xact_id() and an index entry, which bound
// the relay's catch-up by transaction. The store's statement runs on two
// databases, one at schema 7 and one with the column's default and index
// dropped (what schema 6 wrote), in alternating phases (ABBA) of batches
// of 100 documents on 4 connections; the ratio is printed.
func BenchmarkOutboxXid(b *testing.B) {
	ctx := context.Background()
	const workers, stmts, docsPerStmt = 4, 32, 100
	open := func(withXid bool) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(pg.MigratedDatabase(b))
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = workers
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		if !withXid {
			for _, sql := range []string{`ALTER TABLE outbox ALTER COLUMN xid DROP DEFAULT`, `DROP INDEX outbox_xid`} {
				if _, err := pool.Exec(ctx, sql); err != nil {
					b.Fatal(err)
				}
			}
		}
		warmConnections(b, pool, workers)
		return pool
	}
	with, without := open(true), open(false)
	gen := newDocGen(docsPerStmt)
	chunkCfg := chunking.DefaultConfig()
	seedAndAnalyze(b, with, gen, chunkCfg)
	seedAndAnalyze(b, without, gen, chunkCfg)

	phase := func(pool *pgxpool.Pool, side string, args [][]any) time.Duration {
		d, err := runPhase(ctx, side, workers, stmts, func(i int) error {
			batch := &pgx.Batch{}
			batch.Queue(docstore.LockSQL, args[i][0])
			batch.Queue(rawApplySQL, args[i]...)
			br := pool.SendBatch(ctx, batch)
			_, err := br.Exec()
			if err == nil {
				_, err = br.Exec()
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	var withTime, withoutTime time.Duration
	round := 0
	for b.Loop() {
		b.StopTimer()
		args := func(prefix string) [][]any {
			out := make([][]any, stmts)
			for i := range out {
				docs := make([]contract.Document, docsPerStmt)
				for j := range docs {
					docs[j] = gen.next(prefix)
				}
				var err error
				if out[i], err = buildRawArgs(docs, chunkCfg); err != nil {
					b.Fatal(err)
				}
			}
			return out
		}
		a, c := args("x"), args("y")
		b.StartTimer()
		if round%2 == 0 {
			withTime += phase(with, "xid", a)
			withoutTime += phase(without, "no-xid", c)
		} else {
			withoutTime += phase(without, "no-xid", c)
			withTime += phase(with, "xid", a)
		}
		round++
	}
	docs := float64(round * stmts * docsPerStmt)
	wRate, oRate := docs/withTime.Seconds(), docs/withoutTime.Seconds()
	b.ReportMetric(wRate, "xid_docs/s")
	b.ReportMetric(oRate, "no_xid_docs/s")
	b.ReportMetric(wRate/oRate, "ratio")
	b.Logf("outbox.xid: %.0f docs/s with, %.0f without, ratio %.3f (target >= %.2f), %d phases per side", wRate, oRate, wRate/oRate, xidTarget, round)
	benchsummary.Log(b, benchsummary.Row{Target: "writes with outbox.xid / without (schema 7's cost), batch",
		Figure: fmt.Sprintf("%.0f docs/s", wRate), Limit: fmt.Sprintf("%.0f docs/s", oRate), Ratio: wRate / oRate,
		Goal: fmt.Sprintf(">= %.2f", xidTarget), Met: wRate/oRate >= xidTarget})
}
