package writer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

func reemitURL(e *env) string { return e.srv.URL + "/v1/admin/reemit" }

func postReemit(t *testing.T, e *env, body string) (int, writer.ReemitResponse, string) {
	t.Helper()
	code, _, raw := do(t, "POST", reemitURL(e), "application/json", body)
	var resp writer.ReemitResponse
	if code == 200 {
		if err := json.Unmarshal([]byte(raw), &resp); err != nil {
			t.Fatalf("answer %s: %v", raw, err)
		}
	}
	return code, resp, raw
}

// POST /v1/admin/reemit re-emits the named documents, or pages through all
// of them, and answers what it wrote to the outbox.
func TestReemitEndpoint(t *testing.T) {
	e := newEnv(t)
	var keys []string
	for i := range 5 {
		key := fmt.Sprintf("doc/%d", i)
		keys = append(keys, key)
		if code, _, raw := do(t, "PUT", docURL(e, key), "application/json", fmt.Sprintf(`{"version":%d,"title":"T","body":"body %d"}`, i+1, i)); code != 200 {
			t.Fatalf("PUT %s: %d %s", key, code, raw)
		}
	}
	if code, _, raw := do(t, "DELETE", docURL(e, "doc/4")+"?version=9", "", ""); code != 200 {
		t.Fatalf("DELETE: %d %s", code, raw)
	}

	code, resp, raw := postReemit(t, e, `{"keys":["doc/4","nope","doc/1"]}`)
	if code != 200 || !slices.Equal(resp.NotFound, []string{"nope"}) || resp.Next != "" || len(resp.Reemitted) != 2 {
		t.Fatalf("keys: %d %s", code, raw)
	}
	r := resp.Reemitted
	if r[0].Key != "doc/1" || r[0].Version != 2 || r[0].EventID != contract.EventID("doc/1", 2, contract.KindUpserted) || r[0].Emission <= 0 ||
		r[1].Key != "doc/4" || r[1].Version != 9 || r[1].EventID != contract.EventID("doc/4", 9, contract.KindWithdrawn) || r[1].Emission <= 0 {
		t.Fatalf("re-emitted %+v", r)
	}
	if !strings.Contains(raw, `"not_found":["nope"]`) || !strings.Contains(raw, `"event_id":"`) || !strings.Contains(raw, `"next":""`) {
		t.Fatalf("answer's shape: %s", raw)
	}
	if code, resp, raw := postReemit(t, e, `{"keys":[]}`); code != 200 || len(resp.Reemitted) != 0 || !strings.Contains(raw, `"reemitted":[]`) || !strings.Contains(raw, `"not_found":[]`) {
		t.Fatalf("no keys: %d %s", code, raw)
	}

	var seen []string
	after, pages := "", 0
	for {
		code, resp, raw := postReemit(t, e, fmt.Sprintf(`{"all":true,"after":%q,"limit":2}`, after))
		if code != 200 {
			t.Fatalf("all after %q: %d %s", after, code, raw)
		}
		pages++
		for _, d := range resp.Reemitted {
			seen = append(seen, d.Key)
		}
		if resp.Next == "" {
			break
		}
		after = resp.Next
	}
	if !slices.Equal(seen, keys) || pages != 3 {
		t.Fatalf("paged %d times through %v, want %v", pages, seen, keys)
	}
	if code, resp, raw := postReemit(t, e, `{"all":true}`); code != 200 || len(resp.Reemitted) != 5 || resp.Next != "" {
		t.Fatalf("all with the default limit: %d %s", code, raw)
	}
	var rows int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE emission > 0`).Scan(&rows); err != nil || rows != 5 {
		t.Fatalf("%d re-emitted outbox rows (%v), want one per document", rows, err)
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues("reemit", "200")); got != 6 {
		t.Fatalf("requests{route=reemit,code=200} = %v, want 6", got)
	}
	if got := testutil.ToFloat64(e.metrics.Documents.WithLabelValues("reemit", "reemitted")); got != 12 {
		t.Fatalf("documents{source=reemit,result=reemitted} = %v, want 12", got)
	}
}

// A bad re-emission request is refused with a code naming the problem.
func TestReemitEndpointRefusesBadRequests(t *testing.T) {
	e := newEnv(t)
	many := make([]string, writer.MaxReemitKeys+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	manyJSON, _ := json.Marshal(map[string]any{"keys": many})
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		code              string
	}{
		{"not JSON", "application/json", `{"keys":`, 400, "invalid_json"},
		{"unknown field", "application/json", `{"key":["a"]}`, 400, "invalid_json"},
		{"trailing data", "application/json", `{"all":true} {}`, 400, "invalid_json"},
		{"content type", "text/plain", `{"all":true}`, 415, "unsupported_media_type"},
		{"neither", "application/json", `{}`, 422, "invalid_request"},
		{"both", "application/json", `{"all":true,"keys":["a"]}`, 422, "invalid_request"},
		{"after without all", "application/json", `{"keys":["a"],"after":"a"}`, 422, "invalid_request"},
		{"limit too large", "application/json", fmt.Sprintf(`{"all":true,"limit":%d}`, writer.MaxReemitKeys+1), 422, "invalid_limit"},
		{"negative limit", "application/json", `{"all":true,"limit":-1}`, 422, "invalid_limit"},
		{"zero limit", "application/json", `{"all":true,"limit":0}`, 422, "invalid_limit"},
		{"fractional limit", "application/json", `{"all":true,"limit":2.5}`, 422, "invalid_limit"},
		{"keys with all false", "application/json", `{"keys":["a"],"all":false}`, 422, "invalid_request"},
		{"null after", "application/json", `{"all":true,"after":null}`, 422, "invalid_request"},
		{"null keys", "application/json", `{"keys":null}`, 422, "invalid_request"},
		{"too many keys", "application/json", string(manyJSON), 422, "too_many_keys"},
		{"empty key", "application/json", `{"keys":["a",""]}`, 422, contract.CodeMissingKey},
		{"control character", "application/json", `{"keys":["a\u0001"]}`, 422, contract.CodeKeyControlChar},
	} {
		code, r, raw := do(t, "POST", reemitURL(e), tc.ctype, tc.body)
		if code != tc.status || r.Error == nil || r.Error.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, code, raw, tc.status, tc.code)
		}
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues("reemit", "422")); got != 13 {
		t.Errorf("requests{route=reemit,code=422} = %v, want 13", got)
	}
}

// A document whose stored rows cannot rebuild its original event is
// refused, named, and nothing is re-emitted. (Since schema version 3 the
// meta text is stored too; a row written before lacks it.)
func TestReemitEndpointNamesAnIrreproducibleDocument(t *testing.T) {
	e := newEnv(t)
	for key, body := range map[string]string{"odd": `{"version":1,"body":"x","meta":{"n":1E2}}`, "fine": `{"version":1,"body":"y"}`} {
		if code, _, raw := do(t, "PUT", docURL(e, key), "application/json", body); code != 200 {
			t.Fatalf("PUT %s: %d %s", key, code, raw)
		}
	}
	// Retention removed the original rows, and odd was written before
	// schema version 3 (no meta text: its jsonb meta reads back as 100).
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM outbox; UPDATE documents SET meta_text = NULL WHERE key = 'odd'`); err != nil {
		t.Fatal(err)
	}
	code, r, raw := do(t, "POST", reemitURL(e), "application/json", `{"all":true}`)
	if code != 500 || r.Error == nil || r.Error.Code != "not_reproducible" || !strings.Contains(r.Error.Message, `"odd"`) {
		t.Fatalf("%d %s, want 500 not_reproducible naming odd", code, raw)
	}
	var rows int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows after a refused re-emission (%v)", rows, err)
	}
	if code, resp, raw := postReemit(t, e, `{"keys":["fine"]}`); code != 200 || len(resp.Reemitted) != 1 {
		t.Fatalf("the other document: %d %s", code, raw)
	}
}
