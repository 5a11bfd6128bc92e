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
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/source"
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
