package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// The digests of a few buckets read at a position are those of the same
// buckets among all of them, and their documents those Buckets reads; the
// position is Postgres's WAL position after the read, before a write made
// after it.
func TestDigestsAtAreThoseOfTheirBuckets(t *testing.T) {
	pool := setup(t)
	truth := &postgres.Postgres{Pool: pool}
	ctx := context.Background()
	for _, kind := range []verify.Kind{verify.Index, verify.Graph} {
		all, err := truth.Digests(ctx, kind, 64)
		if err != nil {
			t.Fatal(err)
		}
		some := []int{0, 5, 17, 63}
		got, pos, err := truth.DigestsAt(ctx, kind, 64, some)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(some) {
			t.Fatalf("%s: %d digests for %d buckets", kind, len(got), len(some))
		}
		docs := 0
		for _, b := range some {
			if got[b] != all[b] {
				t.Errorf("%s: bucket %d: %+v, among all %+v", kind, b, got[b], all[b])
			}
			docs += got[b].Docs
		}
		if docs == 0 {
			t.Fatalf("%s: the buckets asked for hold no document: the test compares nothing", kind)
		}
		byBucket, pos2, err := truth.BucketsAt(ctx, kind, 64, some)
		if err != nil {
			t.Fatal(err)
		}
		want, err := truth.Buckets(ctx, kind, 64, some)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range some {
			if fmt.Sprint(byBucket[b]) != fmt.Sprint(want[b]) {
				t.Errorf("%s: bucket %d: documents at a position differ from Buckets'", kind, b)
			}
		}
		var after string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		now, err := verify.ParseLSN(after)
		if err != nil {
			t.Fatal(err)
		}
		if pos == 0 || pos > pos2 || pos2 > now {
			t.Errorf("%s: positions %s then %s, and %s after them", kind, pos, pos2, now)
		}
	}
}

// BenchmarkWatchStep is the load of one step of converge verify -watch
// on Postgres at the default step (64 of 1024 buckets), for both kinds of
// store, and (full-) of the digests of every bucket that converge verify
// reads, on a corpus of CONVERGE_BENCH_WATCH_DOCS documents (default
// 20,000) of 3 chunks: the backend's CPU time per step (from
// /proc/<pid>/stat), the rows it read, and the wall time.
func BenchmarkWatchStep(b *testing.B) {
	ctx := context.Background()
	url, load := corpus(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1 // one backend, whose CPU time is read
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	truth := &postgres.Postgres{Pool: pool}
	step := make([]int, verify.DefaultWatchStep)
	for _, run := range []string{"index", "graph", "full-index", "full-graph"} {
		name, full := strings.CutPrefix(run, "full-")
		kind := verify.Kind(name)
		b.Run(run, func(b *testing.B) {
			rows := func() int64 {
				// The backend's counts reach the shared statistics once it
				// flushes them: at the end of this statement's transaction.
				if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
					b.Fatal(err)
				}
				var r int64
				if err := load.QueryRow(ctx, `SELECT sum(seq_tup_read + coalesce(idx_tup_fetch, 0))::bigint FROM pg_stat_user_tables
					WHERE relname IN ('documents', 'chunks')`).Scan(&r); err != nil {
					b.Fatal(err)
				}
				return r
			}
			cpu0, rows0 := cpuTime(b, pid), rows()
			b.ResetTimer()
			var err error
			for i := 0; b.Loop(); i++ {
				for j := range step {
					step[j] = (i*len(step) + j) % verify.DefaultBuckets
				}
				if full {
					_, err = truth.Digests(ctx, kind, verify.DefaultBuckets)
				} else {
					_, _, err = truth.DigestsAt(ctx, kind, verify.DefaultBuckets, step)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b, pid)-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/step")
			b.ReportMetric(float64(rows()-rows0)/float64(b.N), "rows/step")
		})
	}
}

// cpuTime is the user and system CPU time of process pid.
func cpuTime(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("the backend's CPU time cannot be read: %v", err)
	}
	// The fields after the command's closing parenthesis; utime and stime
	// are the 14th and 15th of the line.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// corpus is a database of CONVERGE_BENCH_WATCH_DOCS documents (default
// 20,000) of 3 chunks each, and a pool on it.
func corpus(b *testing.B) (string, *pgxpool.Pool) {
	b.Helper()
	n := 20000
	if s := os.Getenv("CONVERGE_BENCH_WATCH_DOCS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	url := pg.MigratedDatabase(b)
	load, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(load.Close)
	store, err := docstore.New(load, docstore.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	para := strings.Repeat("words of a paragraph long enough to make a chunk of its own ", 20)
	for lo := 0; lo < n; lo += 500 {
		var writes []docstore.Write
		for i := lo; i < min(lo+500, n); i++ {
			writes = append(writes, docstore.Write{Doc: contract.Document{Key: fmt.Sprintf("corpus/%07d", i), Version: 1, Title: "t",
				Body: para + "one\n\n" + para + "two\n\n" + para + "three", Links: []string{"corpus/0000001"}, Tags: []string{"a", "b"}}})
		}
		if _, err := store.Apply(ctx, writes); err != nil {
			b.Fatal(err)
		}
	}
	for _, table := range []string{"documents", "chunks"} {
		if _, err := load.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
			b.Fatal(err)
		}
	}
	return url, load
}

// passed is a projection that has always passed every position.
type passed struct{}

func (passed) Passed(context.Context, string, verify.Position) (bool, error) { return true, nil }

// BenchmarkWatchDefaultPace runs converge verify -watch's watcher at its
// default pace (a pass of 1,024 buckets in 16 minutes, 64 at a step, a
// step a minute) against Postgres for CONVERGE_BENCH_WATCH_FOR (default
// 3m), on the corpus of BenchmarkWatchStep, with both stores in memory and
// in agreement and their projections always past every position (so that
// only the watcher's own reads of Postgres are counted; the slot reads
// while a real projection catches up, a few a step, are not): Postgres's
// CPU time, rows read and transactions a minute. Run it with -benchtime 1x.
func BenchmarkWatchDefaultPace(b *testing.B) {
	d := 3 * time.Minute
	if s := os.Getenv("CONVERGE_BENCH_WATCH_FOR"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	url, load := corpus(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	truth := &postgres.Postgres{Pool: pool}
	all := make([]int, verify.DefaultBuckets)
	for i := range all {
		all[i] = i
	}
	var stores []verify.Projection
	for _, kind := range []verify.Kind{verify.Index, verify.Graph} {
		byBucket, err := truth.Buckets(ctx, kind, verify.DefaultBuckets, all)
		if err != nil {
			b.Fatal(err)
		}
		m := &verify.Memory{Label: string(kind)}
		for _, ds := range byBucket {
			m.Docs = append(m.Docs, ds...)
		}
		stores = append(stores, verify.Projection{Kind: kind, Side: m})
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	stats := func() (rows, xacts int64) {
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		if err := load.QueryRow(ctx, `SELECT tup_returned + tup_fetched, xact_commit + xact_rollback FROM pg_stat_database
			WHERE datname = current_database()`).Scan(&rows, &xacts); err != nil {
			b.Fatal(err)
		}
		return rows, xacts
	}
	w, err := verify.NewWatcher(truth, stores, passed{}, verify.WatchConfig{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		cpu0 := cpuTime(b, pid)
		rows0, xacts0 := stats()
		wctx, cancel := context.WithTimeout(ctx, d)
		if err := w.Run(wctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		rows1, xacts1 := stats()
		minutes := d.Minutes()
		b.ReportMetric(float64(cpuTime(b, pid)-cpu0)/float64(time.Millisecond)/minutes, "pg-cpu-ms/min")
		// The two statistics reads themselves are not the watcher's.
		b.ReportMetric(float64(rows1-rows0)/d.Seconds(), "rows/s")
		b.ReportMetric(float64(xacts1-xacts0-2)/minutes, "xacts/min")
		st := w.Status()
		for _, s := range st.Stores {
			if s.ProvenFraction == 0 {
				b.Fatalf("%s: nothing proven in %s", s.Store, d)
			}
		}
		b.ReportMetric(st.Stores[0].ProvenFraction, "proven-fraction")
	}
}
