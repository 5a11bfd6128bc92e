package writer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// handOver inserts documents into the inbox in one producer transaction,
// with a row of the producer's own table; it commits unless rollback.
func handOver(t *testing.T, e *env, rollback bool, docs map[string]string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS producer_orders (id serial PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `INSERT INTO producer_orders (note) VALUES ('an order')`); err != nil {
		t.Fatal(err)
	}
	for key, doc := range docs {
		if _, err := tx.Exec(ctx, `INSERT INTO converge_inbox (key, document) VALUES ($1, $2)`, key, doc); err != nil {
			t.Fatal(err)
		}
	}
	if rollback {
		return
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func count(t testing.TB, e *env, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A document handed over in the producer's transaction is applied as a
// PUT is (its document, chunks and outbox row), and leaves the inbox in the
// same transaction; the same document PUT afterwards is unchanged.
func TestInboxAppliesWhatIsHandedOver(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	handOver(t, e, false, map[string]string{
		"inbox/a": `{"version": 1, "title": "A", "body": "alpha body", "tags": ["x"], "links": ["inbox/b"]}`,
		"inbox/b": `{"version": 3, "body": "beta body"}`,
	})
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, nil)
	n, err := in.Drain(ctx)
	if err != nil || n != 2 {
		t.Fatalf("drain: %d rows, %v; want 2", n, err)
	}
	if got := count(t, e, `SELECT count(*) FROM converge_inbox`); got != 0 {
		t.Errorf("%d rows left in the inbox", got)
	}
	if got := count(t, e, `SELECT count(*) FROM outbox WHERE key IN ('inbox/a', 'inbox/b')`); got != 2 {
		t.Errorf("%d outbox rows, want 2", got)
	}
	rec, err := e.store.Get(ctx, "inbox/a")
	if err != nil || rec.Version != 1 || rec.Title != "A" {
		t.Fatalf("inbox/a: %+v, %v", rec, err)
	}
	// The same version again over HTTP: unchanged, as for a PUT repeated.
	req, _ := http.NewRequest(http.MethodPut, e.srv.URL+"/v1/documents/inbox/b", strings.NewReader(`{"version": 3, "body": "beta body"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT of what the inbox applied: %d", resp.StatusCode)
	}
	if got := testutil.ToFloat64(e.metrics.Documents.WithLabelValues("inbox", "applied")); got != 2 {
		t.Errorf("converge_writer_documents_total{source=inbox,result=applied} = %v, want 2", got)
	}
	// A withdrawal, handed over the same way.
	handOver(t, e, false, map[string]string{"inbox/a": `{"version": 2, "withdrawn": true}`})
	if _, err := in.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.store.Get(ctx, "inbox/a"); err != nil || !rec.Withdrawn || rec.Version != 2 {
		t.Fatalf("inbox/a after its withdrawal: %+v, %v", rec, err)
	}
}

// A producer's rollback leaves nothing anywhere: not its row, not the
// inbox's, no document, no outbox row.
func TestInboxRollbackLeavesNothing(t *testing.T) {
	e := newEnv(t)
	handOver(t, e, true, map[string]string{"inbox/rolled-back": `{"version": 1, "body": "never"}`})
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, nil)
	if n, err := in.Drain(context.Background()); err != nil || n != 0 {
		t.Fatalf("drain: %d, %v", n, err)
	}
	for _, sql := range []string{`SELECT count(*) FROM converge_inbox`, `SELECT count(*) FROM producer_orders`,
		`SELECT count(*) FROM documents`, `SELECT count(*) FROM outbox`} {
		if got := count(t, e, sql); got != 0 {
			t.Errorf("%s: %d", sql, got)
		}
	}
}

// What the API would refuse stays in the inbox with the API's code and
// message, counted; the rest of the batch is applied.
func TestInboxKeepsWhatItRefuses(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.store.Put(ctx, contract.Document{Key: "inbox/taken", Version: 5, Body: "the stored body"}); err != nil {
		t.Fatal(err)
	}
	handOver(t, e, false, map[string]string{
		"inbox/fine":      `{"version": 1, "body": "fine"}`,
		"inbox/conflict":  `{"version": 5, "body": "another body at the same version"}`,
		"":                `{"version": 1, "body": "no key"}`,
		"inbox/noversion": `{"body": "no version"}`,
		"inbox/unknown":   `{"version": 1, "body": "b", "colour": "red"}`,
	})
	// The conflict's key differs from the stored one's: point it there.
	if _, err := e.pool.Exec(ctx, `UPDATE converge_inbox SET key = 'inbox/taken' WHERE key = 'inbox/conflict'`); err != nil {
		t.Fatal(err)
	}
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, nil)
	if n, err := in.Drain(ctx); err != nil || n != 5 {
		t.Fatalf("drain: %d, %v; want 5 taken", n, err)
	}
	rows, err := e.pool.Query(ctx, `SELECT key, refused_code, refused_message FROM converge_inbox ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var key, code, msg string
		if err := rows.Scan(&key, &code, &msg); err != nil {
			t.Fatal(err)
		}
		if msg == "" {
			t.Errorf("%q refused without a message", key)
		}
		got[key] = code
	}
	want := map[string]string{"inbox/taken": "version_conflict", "": "missing_key", "inbox/noversion": "missing_version", "inbox/unknown": "invalid_json"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("refused rows %v, want %v", got, want)
	}
	if _, err := e.store.Get(ctx, "inbox/fine"); err != nil {
		t.Errorf("the valid document of the batch: %v", err)
	}
	if got := testutil.ToFloat64(e.metrics.InboxRefused.WithLabelValues("version_conflict")); got != 1 {
		t.Errorf("converge_writer_inbox_refused_total{code=version_conflict} = %v", got)
	}
	// A refused row is not taken again.
	if n, err := in.Drain(ctx); err != nil || n != 0 {
		t.Fatalf("second drain: %d, %v; want nothing taken", n, err)
	}
}

// Run drains what committed before it started, then wakes on the
// trigger's notification: a document handed over while it waits is
// applied at once, with no poll interval.
func TestInboxIsWokenByItsNotification(t *testing.T) {
	e := newEnv(t)
	handOver(t, e, false, map[string]string{"inbox/before": `{"version": 1, "body": "before the writer"}`})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, discardLogger())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	waitApplied(t, e, "inbox/before")
	start := time.Now()
	handOver(t, e, false, map[string]string{"inbox/after": `{"version": 1, "body": "while it waits"}`})
	waitApplied(t, e, "inbox/after")
	t.Logf("applied %v after the producer's commit", time.Since(start))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func waitApplied(t *testing.T, e *env, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := e.store.Get(context.Background(), key); err == nil {
			return
		} else if !errors.Is(err, docstore.ErrNotFound) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not applied within 10s", key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// blockingStore holds ApplyTx until released, as a writer stopped between
// taking rows and applying them.
type blockingStore struct {
	writer.InboxStore
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) ApplyTx(ctx context.Context, tx pgx.Tx, w []docstore.Write) ([]docstore.Outcome, error) {
	close(b.entered)
	<-b.release
	return b.InboxStore.ApplyTx(ctx, tx, w)
}

// A writer whose connection dies after it took rows and before it
// applied them (its process killed: Postgres ends its transaction) leaves
// those rows to the next writer, which applies each once; while the first
// holds them, another writer skips them rather than wait or take them
// twice.
func TestInboxRowsOfADeadWriterAreTakenAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	handOver(t, e, false, map[string]string{"inbox/held": `{"version": 1, "body": "held"}`})
	held := &blockingStore{InboxStore: e.store, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(held.release) }) }
	// A failing check must not leave the first drain holding its
	// connection: the pool's Close would wait for it.
	t.Cleanup(release)
	// One transaction at a time: a second one of this writer starting
	// late, after the kill, would take the row back itself.
	first := writer.NewInbox(e.pool, held, writer.InboxConfig{Parallel: 1}, e.metrics, nil)
	drained := make(chan error, 1)
	go func() { _, err := first.Drain(ctx); drained <- err }()
	<-held.entered
	// Meanwhile a second writer finds nothing it may take.
	second := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, nil)
	if n, err := second.Drain(ctx); err != nil || n != 0 {
		t.Fatalf("a second writer took %d held rows (%v)", n, err)
	}
	// The first writer's connection dies, as its process would; waiting
	// (up to 5s) until its backend is gone, its transaction rolled back.
	if got := count(t, e, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 5000) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE c.relname = 'converge_inbox' AND l.mode = 'RowShareLock' AND pid <> pg_backend_pid()) t`); got != 1 {
		t.Fatalf("%d writers held the inbox's rows, want 1", got)
	}
	release()
	if err := <-drained; err == nil {
		t.Fatal("the killed writer's drain succeeded")
	}
	if n, err := second.Drain(ctx); err != nil || n != 1 {
		t.Fatalf("after the kill the second writer took %d rows (%v), want 1", n, err)
	}
	if got := count(t, e, `SELECT count(*) FROM outbox WHERE key = 'inbox/held'`); got != 1 {
		t.Fatalf("%d outbox rows for the held document, want 1", got)
	}
}

// Eight producer connections hand 10,000 documents over while writers
// drain concurrently and are stopped and started again: every document is
// applied exactly once (one outbox row each), and the inbox ends empty.
func TestInboxUnderConcurrentProducersAndRestartingWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 documents")
	}
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const producers, perProducer = 8, 1250
	var writers sync.WaitGroup
	var restarts atomic.Int32
	stopWriters := make(chan struct{})
	for w := range 2 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for {
				runCtx, stop := context.WithCancel(ctx)
				in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{BatchSize: 64 * (w + 1)}, e.metrics, discardLogger())
				done := make(chan struct{})
				go func() { _ = in.Run(runCtx); close(done) }()
				select {
				case <-stopWriters:
					stop()
					<-done
					return
				case <-time.After(300 * time.Millisecond):
					stop() // a restart, mid-drain or idle
					<-done
					restarts.Add(1)
				}
			}
		}()
	}
	g, gctx := errgroup.WithContext(ctx)
	for p := range producers {
		g.Go(func() error {
			for i := range perProducer {
				key := fmt.Sprintf("inbox/p%d/%05d", p, i)
				tx, err := e.pool.Begin(gctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(gctx, `INSERT INTO converge_inbox (key, document) VALUES ($1, $2)`, key,
					fmt.Sprintf(`{"version": 1, "body": "document %d of producer %d"}`, i, p)); err != nil {
					_ = tx.Rollback(gctx)
					return err
				}
				if err := tx.Commit(gctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for count(t, e, `SELECT count(*) FROM converge_inbox`) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still in the inbox", count(t, e, `SELECT count(*) FROM converge_inbox`))
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stopWriters)
	writers.Wait()
	if got := count(t, e, `SELECT count(*) FROM outbox`); got != producers*perProducer {
		t.Fatalf("%d outbox rows, want %d: one per document", got, producers*perProducer)
	}
	if got := count(t, e, `SELECT count(DISTINCT key) FROM outbox`); got != producers*perProducer {
		t.Fatalf("%d distinct keys in the outbox, want %d", got, producers*perProducer)
	}
	if restarts.Load() < 2 {
		t.Fatalf("the writers restarted %d times: the test did not restart them under load", restarts.Load())
	}
	t.Logf("10,000 documents through 8 producers, writers restarted %d times", restarts.Load())
}
