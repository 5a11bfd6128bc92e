package writer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// flakyStore fails the first n writes, as a database outage would, to show
// that messages are acknowledged only after a commit.
type flakyStore struct {
	writer.Store
	failures atomic.Int32
	calls    atomic.Int32
}

func (f *flakyStore) Apply(ctx context.Context, w []docstore.Write) ([]docstore.Outcome, error) {
	f.calls.Add(1)
	if f.failures.Add(-1) >= 0 {
		return nil, errors.New("injected: connection refused")
	}
	return f.Store.Apply(ctx, w)
}

// newJetStream starts an embedded NATS server for the test and connects to
// its JetStream.
func newJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// traceContexts is the trace context stored with each outbox row, by key
// ("" for none).
func traceContexts(t *testing.T, e *env) map[string]string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT key, coalesce(trace_context, '') FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var key, tc string
		if err := rows.Scan(&key, &tc); err != nil {
			t.Fatal(err)
		}
		got[key] = tc
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func startIngest(t *testing.T, js jetstream.JetStream, store writer.Store) (*writer.Metrics, func()) {
	t.Helper()
	metrics := writer.NewMetrics(nil)
	in := writer.NewIngest(js, store, writer.IngestConfig{BatchSize: 64, MaxWait: 50 * time.Millisecond,
		RetryDelay: 50 * time.Millisecond}, metrics, nil)
	if err := in.EnsureStreams(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := in.Run(ctx); err != nil {
			t.Errorf("ingest: %v", err)
		}
	}()
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return metrics, stop
}

func publish(t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	if _, err := js.Publish(context.Background(), subject, []byte(data)); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// waitTimeout bounds the tests' waits for the asynchronous paths.
const waitTimeout = 30 * time.Second

func countRows(t *testing.T, e *env, sql string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestIngestAppliesAndDeadLetters(t *testing.T) {
	e := newEnv(t)
	js := newJetStream(t)
	store := &flakyStore{Store: e.store}
	store.failures.Store(2)
	metrics, _ := startIngest(t, js, store)

	// Every document three times, versions interleaved, as an
	// at-least-once producer would.
	const docs = 40
	for round := range 3 {
		for i := range docs {
			key := fmt.Sprintf("queue/doc %d", i)
			for v := 1; v <= 2; v++ {
				publish(t, js, contract.IngestSubject(key), fmt.Sprintf(`{"key":%q,"version":%d,"title":"v%d","body":"body %d"}`, key, v, v, i))
			}
			if round == 2 && i%10 == 0 {
				publish(t, js, contract.IngestSubject(key), fmt.Sprintf(`{"key":%q,"version":3,"withdrawn":true}`, key))
			}
		}
	}
	// Poison: malformed, on the wrong subject, and a version conflict.
	publish(t, js, contract.IngestSubject("bad"), `{"key":"bad","version":`)
	publish(t, js, contract.IngestSubject("someone-else"), `{"key":"queue/doc 1","version":9,"title":"x"}`)
	publish(t, js, contract.IngestSubject("queue/doc 5"), `{"key":"queue/doc 5","version":2,"title":"different"}`)

	testenv.Eventually(t, "all documents", waitTimeout, func() bool {
		return countRows(t, e, `SELECT count(*) FROM documents WHERE version >= 2`) == docs
	})
	dlq, err := js.Stream(context.Background(), writer.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "three dead letters", waitTimeout, func() bool {
		info, err := dlq.Info(context.Background())
		return err == nil && info.State.Msgs == 3
	})
	wantCodes := map[string]bool{"invalid_json": false, "subject_mismatch": false, "version_conflict": false}
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := dlq.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		code := m.Header.Get(writer.HeaderDLQCode)
		if _, ok := wantCodes[code]; !ok || m.Header.Get(writer.HeaderDLQReason) == "" || m.Header.Get(writer.HeaderDLQSubject) == "" {
			t.Fatalf("dead letter %d: code %q headers %v", seq, code, m.Header)
		}
		wantCodes[code] = true
		if m.Subject != contract.DLQSubject(writer.IngestDLQName) {
			t.Fatalf("dead letter on %s", m.Subject)
		}
	}
	for code, seen := range wantCodes {
		if !seen {
			t.Errorf("no dead letter with code %s", code)
		}
	}
	// Work-queue retention: a message leaves the stream when acknowledged,
	// which happens only after its commit; once drained, all is written.
	ingest, _ := js.Stream(context.Background(), writer.IngestStream)
	testenv.Eventually(t, "ingest stream drained", waitTimeout, func() bool {
		info, err := ingest.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	// Exactly one event per applied (key, version), however many
	// deliveries and failed attempts there were. How many versions apply
	// depends on delivery order (a version 1 redelivered after its
	// version 2 is stale), so the outbox is checked against what was
	// reported applied, and for the final version of every document.
	applied := int(testutil.ToFloat64(metrics.Documents.WithLabelValues("ingest", "applied")))
	if n := countRows(t, e, `SELECT count(*) FROM outbox`); n != applied || n < docs || n > 2*docs+docs/10 {
		t.Fatalf("outbox rows %d, %d writes reported applied (between %d and %d possible)", n, applied, docs, 2*docs+docs/10)
	}
	if n := countRows(t, e, `SELECT count(*) FROM (SELECT key, version FROM outbox GROUP BY key, version HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d (key, version) pairs with more than one event", n)
	}
	if n := countRows(t, e, `SELECT count(*) FROM documents d WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.key = d.key AND o.version = d.version)`); n != 0 {
		t.Fatalf("%d documents whose current version has no event", n)
	}
	if n := countRows(t, e, `SELECT count(*) FROM documents WHERE deleted`); n != docs/10 {
		t.Fatalf("withdrawn %d, want %d", n, docs/10)
	}
	if store.calls.Load() < 3 {
		t.Fatalf("store called %d times; the injected failures were not exercised", store.calls.Load())
	}
}

// The queue path continues a producer's trace: a valid traceparent header
// is stored with the outbox row (for the relay to publish), a malformed
// one is dropped as W3C trace context says, and no header stores none.
func TestIngestCarriesTheTraceparent(t *testing.T) {
	e := newEnv(t)
	js := newJetStream(t)
	startIngest(t, js, e.store)
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for key, header := range map[string]string{"traced": valid, "malformed": "00-not-a-trace-01", "untraced": ""} {
		m := nats.NewMsg(contract.IngestSubject(key))
		m.Data = []byte(fmt.Sprintf(`{"key":%q,"version":1,"title":"t","body":"b"}`, key))
		if header != "" {
			m.Header.Set("traceparent", header)
		}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "the three documents", waitTimeout, func() bool {
		return countRows(t, e, `SELECT count(*) FROM outbox`) == 3
	})
	got := traceContexts(t, e)
	if got["traced"] != valid || got["malformed"] != "" || got["untraced"] != "" {
		t.Fatalf("trace contexts stored: %q; want only the valid one's, on its document", got)
	}
}

// A store that is down keeps messages in the stream: nothing is acknowledged
// before a commit, so nothing is lost when the writer stops mid-outage.
func TestIngestDoesNotAckWithoutCommit(t *testing.T) {
	e := newEnv(t)
	ns := testenv.StartNATS(t)
	nc := ns.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store := &flakyStore{Store: e.store}
	store.failures.Store(1 << 30)
	_, stop := startIngest(t, js, store)
	for i := range 10 {
		key := fmt.Sprintf("k%d", i)
		publish(t, js, contract.IngestSubject(key), fmt.Sprintf(`{"key":%q,"version":1}`, key))
	}
	testenv.Eventually(t, "failed attempts", waitTimeout, func() bool { return store.calls.Load() >= 2 })
	stop()
	ingest, _ := js.Stream(context.Background(), writer.IngestStream)
	info, err := ingest.Info(context.Background())
	if err != nil || info.State.Msgs != 10 {
		t.Fatalf("ingest stream holds %d messages (%v), want all 10", info.State.Msgs, err)
	}
	// The writer comes back with a healthy store and applies them all.
	store.failures.Store(0)
	_, _ = startIngest(t, js, store)
	testenv.Eventually(t, "documents after recovery", waitTimeout, func() bool {
		return countRows(t, e, `SELECT count(*) FROM documents`) == 10
	})
}

// The retention loop deletes every aged outbox row, batch after batch, and
// leaves recent ones.
func TestOutboxRetentionLoop(t *testing.T) {
	e := newEnv(t)
	for i := range 25 {
		if _, err := e.store.Put(context.Background(), contract.Document{Key: fmt.Sprintf("r%d", i), Version: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE outbox SET created_at = now() - interval '3 days' WHERE key <> 'r0'`); err != nil {
		t.Fatal(err)
	}
	metrics := writer.NewMetrics(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		writer.RunOutboxRetention(ctx, e.store, writer.RetentionConfig{Retention: 24 * time.Hour, Interval: 20 * time.Millisecond, Batch: 4}, metrics, discardLogger())
	}()
	// The counter moves after the delete commits: waiting for the rows
	// alone and then cancelling could cancel the last delete's answer.
	testenv.Eventually(t, "aged rows deleted and counted", waitTimeout, func() bool {
		return countRows(t, e, `SELECT count(*) FROM outbox`) == 1 && testutil.ToFloat64(metrics.OutboxPruned) >= 24
	})
	cancel()
	<-done
	if got := testutil.ToFloat64(metrics.OutboxPruned); got != 24 {
		t.Fatalf("pruned counter %v, want 24", got)
	}
	if n := countRows(t, e, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows left, want the 1 within the retention", n)
	}
}
