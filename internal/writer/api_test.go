package writer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

type apiResult struct {
	Line    int    `json:"line"`
	Key     string `json:"key"`
	Version int64  `json:"version"`
	Result  string `json:"result"`
	EventID string `json:"event_id"`
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func do(t *testing.T, method, u, contentType, body string) (int, apiResult, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r apiResult
	_ = json.Unmarshal(raw, &r)
	return resp.StatusCode, r, string(raw)
}

func docURL(e *env, key string) string { return e.srv.URL + "/v1/documents/" + url.PathEscape(key) }

func TestPutAndGet(t *testing.T) {
	e := newEnv(t)
	key := "notes/2026/plan b.md?x=1%"
	code, r, raw := do(t, "PUT", docURL(e, key), "application/json",
		`{"version":5,"title":"Plan","body":"# Plan\n\nDo it.","links":["a","a"],"tags":["x"],"meta":{"b":1,"a":"é"}}`)
	if code != 200 || r.Result != "applied" || r.Key != key || r.Version != 5 {
		t.Fatalf("PUT: %d %s", code, raw)
	}
	if r.EventID != contract.EventID(key, 5, contract.KindUpserted).String() {
		t.Fatalf("event id %s is not derived", r.EventID)
	}
	code, _, raw = do(t, "GET", docURL(e, key), "", "")
	if code != 200 {
		t.Fatalf("GET: %d %s", code, raw)
	}
	var rec struct {
		Key       string          `json:"key"`
		Version   int64           `json:"version"`
		Body      string          `json:"body"`
		Links     []string        `json:"links"`
		Meta      json.RawMessage `json:"meta"`
		Withdrawn bool            `json:"withdrawn"`
	}
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Key != key || rec.Version != 5 || rec.Body != "# Plan\n\nDo it." || len(rec.Links) != 1 || rec.Withdrawn {
		t.Fatalf("GET record %+v", rec)
	}
	code, r, _ = do(t, "PUT", docURL(e, key), "application/json",
		`{"version":5,"title":"Plan","body":"# Plan\n\nDo it.","links":["a"],"tags":["x"],"meta":{"a":"é","b":1}}`)
	if code != 200 || r.Result != "unchanged" {
		t.Fatalf("redelivery with equivalent content: %d %+v", code, r)
	}
	code, r, _ = do(t, "PUT", docURL(e, key), "application/json", `{"version":5,"title":"Other"}`)
	if code != 409 || r.Error == nil || r.Error.Code != "version_conflict" {
		t.Fatalf("conflict: %d %+v", code, r)
	}
	code, r, _ = do(t, "PUT", docURL(e, key), "application/json", `{"version":4,"title":"Old"}`)
	if code != 200 || r.Result != "stale" {
		t.Fatalf("stale: %d %+v", code, r)
	}
	code, r, _ = do(t, "DELETE", docURL(e, key)+"?version=6", "", "")
	if code != 200 || r.Result != "applied" || r.EventID != contract.EventID(key, 6, contract.KindWithdrawn).String() {
		t.Fatalf("DELETE: %d %+v", code, r)
	}
	code, _, raw = do(t, "GET", docURL(e, key), "", "")
	if code != 200 || !strings.Contains(raw, `"withdrawn":true`) {
		t.Fatalf("GET tombstone: %d %s", code, raw)
	}
	code, r, _ = do(t, "GET", docURL(e, "nope"), "", "")
	if code != 404 || r.Error == nil || r.Error.Code != "not_found" {
		t.Fatalf("GET missing: %d %+v", code, r)
	}
}

// Every kind of bad input gets its status and a code naming the problem,
// and the document already accepted is not altered by any of them.
func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	good := `{"version":1,"title":"Good","body":"kept"}`
	if code, _, raw := do(t, "PUT", docURL(e, "k"), "application/json", good); code != 200 {
		t.Fatalf("setup: %d %s", code, raw)
	}
	long := strings.Repeat("k", contract.MaxKeyBytes+1)
	big := `{"version":2,"body":"` + strings.Repeat("x", contract.MaxBodyBytes+1) + `"}`
	tests := []struct {
		name, method, url, ctype, body string
		status                         int
		code                           string
	}{
		{"invalid json", "PUT", docURL(e, "k"), "application/json", `{"version":2,`, 400, "invalid_json"},
		{"unknown field", "PUT", docURL(e, "k"), "application/json", `{"version":2,"titel":"x"}`, 400, "invalid_json"},
		{"trailing data", "PUT", docURL(e, "k"), "application/json", `{"version":2} {}`, 400, "invalid_json"},
		{"invalid utf8", "PUT", docURL(e, "k"), "application/json", "{\"version\":2,\"title\":\"\xff\"}", 400, "invalid_utf8"},
		{"missing version", "PUT", docURL(e, "k"), "application/json", `{"title":"x"}`, 422, "missing_version"},
		{"zero version", "PUT", docURL(e, "k"), "application/json", `{"version":0}`, 422, "invalid_version"},
		{"negative version", "PUT", docURL(e, "k"), "application/json", `{"version":-1}`, 422, "invalid_version"},
		{"fractional version", "PUT", docURL(e, "k"), "application/json", `{"version":1.5}`, 422, "invalid_version"},
		{"string version", "PUT", docURL(e, "k"), "application/json", `{"version":"2"}`, 422, "invalid_version"},
		{"key too long", "PUT", docURL(e, long), "application/json", `{"version":2}`, 422, "key_too_long"},
		{"control char in key", "PUT", docURL(e, "a\tb"), "application/json", `{"version":2}`, 422, "key_control_character"},
		{"invalid utf8 key", "PUT", e.srv.URL + "/v1/documents/%FF", "application/json", `{"version":2}`, 400, "invalid_utf8"},
		{"key mismatch", "PUT", docURL(e, "k"), "application/json", `{"key":"j","version":2}`, 422, "key_mismatch"},
		{"body over limit", "PUT", docURL(e, "k"), "application/json", big, 413, "body_too_large"},
		{"wrong content type", "PUT", docURL(e, "k"), "text/plain", `{"version":2}`, 415, "unsupported_media_type"},
		{"no content type", "PUT", docURL(e, "k"), "", `{"version":2}`, 415, "unsupported_media_type"},
		{"meta not an object", "PUT", docURL(e, "k"), "application/json", `{"version":2,"meta":[1]}`, 422, "invalid_meta"},
		{"meta number beyond numeric", "PUT", docURL(e, "k"), "application/json", `{"version":2,"meta":{"n":1e200000}}`, 422, "invalid_meta"},
		{"NUL in body", "PUT", docURL(e, "k"), "application/json", `{"version":2,"body":"a\u0000b"}`, 422, "nul_character"},
		{"empty tag", "PUT", docURL(e, "k"), "application/json", `{"version":2,"tags":[""]}`, 422, "invalid_tag"},
		{"withdrawn on PUT", "PUT", docURL(e, "k"), "application/json", `{"version":2,"withdrawn":true}`, 400, "invalid_json"},
		{"delete without version", "DELETE", docURL(e, "k"), "", "", 422, "missing_version"},
		{"delete bad version", "DELETE", docURL(e, "k") + "?version=abc", "", "", 422, "invalid_version"},
		{"batch wrong content type", "POST", e.srv.URL + "/v1/documents:batch", "application/json", `{}`, 415, "unsupported_media_type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, r, raw := do(t, tt.method, tt.url, tt.ctype, tt.body)
			if code != tt.status || r.Error == nil || r.Error.Code != tt.code || r.Error.Message == "" {
				t.Fatalf("got %d %.300s, want %d %s", code, raw, tt.status, tt.code)
			}
		})
	}
	code, _, raw := do(t, "GET", docURL(e, "k"), "", "")
	if code != 200 || !strings.Contains(raw, `"version":1`) || !strings.Contains(raw, `"body":"kept"`) {
		t.Fatalf("accepted document altered: %s", raw)
	}
	var outbox int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&outbox); err != nil || outbox != 1 {
		t.Fatalf("outbox rows %d (%v), want 1", outbox, err)
	}
}

func TestBatchNDJSON(t *testing.T) {
	e := newEnv(t)
	var b strings.Builder
	for i := range 250 {
		fmt.Fprintf(&b, `{"key":"doc-%d","version":1,"title":"Doc %d","body":"text %d"}`+"\n", i, i, i)
	}
	b.WriteString("\n")                                                          // blank: skipped, no result
	b.WriteString(`{"key":"doc-1","version":1,"title":"changed"}` + "\n")        // line 252: conflict
	b.WriteString(`not json` + "\n")                                             // 253
	b.WriteString(`{"key":"doc-2","version":2,"withdrawn":true}` + "\n")         // 254
	b.WriteString(`{"key":"doc-3","version":1,"title":"Doc 3","body":"text 3"}`) // 255, no final newline
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/documents:batch", strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var results []apiResult
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var r apiResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		results = append(results, r)
	}
	if len(results) != 254 {
		t.Fatalf("%d result lines, want 254 (one per non-blank line)", len(results))
	}
	for i, r := range results[:250] {
		if r.Line != i+1 || r.Result != "applied" || r.Key != fmt.Sprintf("doc-%d", i) {
			t.Fatalf("line %d: %+v", i+1, r)
		}
	}
	tail := results[250:]
	if tail[0].Line != 252 || tail[0].Error == nil || tail[0].Error.Code != "version_conflict" {
		t.Fatalf("conflict line: %+v", tail[0])
	}
	if tail[1].Line != 253 || tail[1].Error == nil || tail[1].Error.Code != "invalid_json" {
		t.Fatalf("bad line: %+v", tail[1])
	}
	if tail[2].Line != 254 || tail[2].Result != "applied" || tail[2].EventID != contract.EventID("doc-2", 2, contract.KindWithdrawn).String() {
		t.Fatalf("withdrawal line: %+v", tail[2])
	}
	if tail[3].Line != 255 || tail[3].Result != "unchanged" {
		t.Fatalf("last line: %+v", tail[3])
	}
	var docs, outbox int
	_ = e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM documents), (SELECT count(*) FROM outbox)`).Scan(&docs, &outbox)
	if docs != 250 || outbox != 251 {
		t.Fatalf("documents %d outbox %d, want 250 and 251", docs, outbox)
	}
}

// A batch much larger than one transaction streams results back while the
// rest of the body is still arriving; no line may be lost (net/http drops
// an unread body after the first flush unless the handler reads and writes
// in full duplex).
func TestLargeBatchLosesNoLine(t *testing.T) {
	e := newEnv(t) // BatchSize 100
	const lines = 700
	pr, pw := io.Pipe()
	go func() {
		filler := strings.Repeat("lorem ipsum ", 170) // ~2 KB per line, ~1.4 MB in all
		for i := range lines {
			fmt.Fprintf(pw, `{"key":"big-%d","version":1,"body":%q}`+"\n", i, filler)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/documents:batch", pr)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for sc.Scan() {
		var r apiResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Result != "applied" || r.Line != n+1 {
			t.Fatalf("result %d: %s (%v)", n+1, sc.Text(), err)
		}
		n++
	}
	if n != lines {
		t.Fatalf("%d result lines for %d input lines", n, lines)
	}
	if got := countRows(t, e, `SELECT count(*) FROM documents`); got != lines {
		t.Fatalf("%d documents stored, want %d", got, lines)
	}
}

// Numbers at the edges of what Postgres numeric holds are accepted and
// stored, not refused by the database after validation passed.
func TestMetaNumbersPostgresCanStore(t *testing.T) {
	e := newEnv(t)
	code, r, raw := do(t, "PUT", docURL(e, "nums"), "application/json",
		`{"version":1,"meta":{"big":1e300,"tiny":1e-300,"neg":-12.5e10,"long":0.`+strings.Repeat("1", 16000)+`}}`)
	if code != 200 || r.Result != "applied" {
		t.Fatalf("PUT: %d %.300s", code, raw)
	}
}

// A version is an integer however JSON writes it (2, 2.0, 2e0): JSON and
// the spec's "integer" do not tell them apart. Anything else is refused.
func TestVersionIsAnyIntegralNumber(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		version string
		want    int64 // 0: refused with invalid_version
	}{
		{"2.0", 2}, {"3e0", 3}, {"4.00E+00", 4}, {"50e-1", 5}, {"9223372036854775807.0", 1<<63 - 1},
		{"2.5", 0}, {"9223372036854775808", 0}, {"1e400", 0}, {"1e-400", 0}, {"0.0", 0}, {"-1.0", 0},
	} {
		code, r, raw := do(t, "PUT", docURL(e, "v"+tc.version), "application/json", `{"version":`+tc.version+`}`)
		switch {
		case tc.want == 0 && (code != 422 || r.Error == nil || r.Error.Code != "invalid_version"):
			t.Errorf("version %s: %d %s, want 422 invalid_version", tc.version, code, raw)
		case tc.want != 0 && (code != 200 || r.Version != tc.want):
			t.Errorf("version %s: %d %s, want version %d", tc.version, code, raw, tc.want)
		}
	}
	if code, r, raw := do(t, "DELETE", docURL(e, "v2.0")+"?version=6.0", "", ""); code != 200 || r.Version != 6 {
		t.Errorf("DELETE ?version=6.0: %d %s", code, raw)
	}
}

// A request's traceparent is stored with its outbox row (tracing off here:
// the writer passes on the caller's); a request without one stores none,
// and a malformed one is not stored.
func TestTraceParentIsStoredWithTheOutboxRow(t *testing.T) {
	e := newEnv(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for key, header := range map[string]string{"traced": tp, "untraced": "", "malformed": "00-xyz"} {
		req, _ := http.NewRequest("PUT", docURL(e, key), strings.NewReader(`{"version":1}`))
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set("traceparent", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("PUT %s: %d", key, resp.StatusCode)
		}
	}
	got := traceContexts(t, e)
	if got["traced"] != tp || got["untraced"] != "" || got["malformed"] != "" || len(got) != 3 {
		t.Fatalf("trace contexts stored: %q", got)
	}
}
