package writer_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// rejectingStore fails any write that includes the key "poison" the way
// Postgres rejects a value it cannot store (SQLSTATE 22003): a permanent
// error that every retry of the same batch would meet again.
type rejectingStore struct {
	writer.Store
	calls atomic.Int32
}

func (r *rejectingStore) Apply(ctx context.Context, ws []docstore.Write) ([]docstore.Outcome, error) {
	r.calls.Add(1)
	for _, w := range ws {
		if w.Doc.Key == "poison" {
			return nil, fmt.Errorf("docstore: apply: %w", &pgconn.PgError{Code: "22003", Message: "value overflows numeric format"})
		}
	}
	return r.Store.Apply(ctx, ws)
}

func TestBatchIsolatesADocumentTheDatabaseRejects(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(writer.NewAPI(&rejectingStore{Store: e.store}, writer.APIConfig{BatchSize: 100}, nil, nil))
	defer srv.Close()
	var b strings.Builder
	for i := range 20 {
		key := fmt.Sprintf("iso-%d", i)
		if i == 7 {
			key = "poison"
		}
		fmt.Fprintf(&b, `{"key":%q,"version":1,"body":"x"}`+"\n", key)
	}
	code, _, raw := do(t, "POST", srv.URL+"/v1/documents:batch", "application/x-ndjson", b.String())
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	lines := strings.Split(strings.TrimSpace(raw), "\n")
	if len(lines) != 20 {
		t.Fatalf("%d result lines, want 20:\n%s", len(lines), raw)
	}
	for i, l := range lines {
		want := `"result":"applied"`
		if i == 7 {
			want = `"code":"rejected_value"`
		}
		if !strings.Contains(l, want) {
			t.Fatalf("line %d: %s, want %s", i+1, l, want)
		}
	}
	if n := countRows(t, e, `SELECT count(*) FROM documents`); n != 19 {
		t.Fatalf("%d documents stored, want the 19 others", n)
	}
	code, r, _ := do(t, "PUT", srv.URL+"/v1/documents/poison", "application/json", `{"version":1}`)
	if code != 422 || r.Error == nil || r.Error.Code != "rejected_value" {
		t.Fatalf("PUT of a rejected document: %d %+v", code, r)
	}
}

func TestIngestDeadLettersADocumentTheDatabaseRejects(t *testing.T) {
	e := newEnv(t)
	js := newJetStream(t)
	store := &rejectingStore{Store: e.store}
	_, _ = startIngest(t, js, store)
	for i := range 30 {
		key := fmt.Sprintf("iso-%d", i)
		if i == 11 {
			key = "poison"
		}
		publish(t, js, contract.IngestSubject(key), fmt.Sprintf(`{"key":%q,"version":1}`, key))
	}
	testenv.Eventually(t, "the 29 others", waitTimeout, func() bool { return countRows(t, e, `SELECT count(*) FROM documents`) == 29 })
	dlq, err := js.Stream(context.Background(), writer.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "one dead letter", waitTimeout, func() bool {
		info, err := dlq.Info(context.Background())
		return err == nil && info.State.Msgs == 1
	})
	m, err := dlq.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(writer.HeaderDLQCode) != "rejected_value" || !strings.Contains(string(m.Data), "poison") {
		t.Fatalf("dead letter %s: %v", m.Data, m.Header)
	}
	ingest, _ := js.Stream(context.Background(), writer.IngestStream)
	testenv.Eventually(t, "ingest stream drained", waitTimeout, func() bool {
		info, err := ingest.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
}
