package client_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/api"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

var fast = client.WithRetry(client.Retry{Attempts: 5, Base: 10 * time.Millisecond, Max: 50 * time.Millisecond})

func newClient(t *testing.T, base string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(base, append([]client.Option{client.WithToken(token), fast}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ownWriter is a writer over a database of the test's own, its store
// wrapped by wrap; it returns the writer's URL and the pool.
func ownWriter(t *testing.T, wrap func(writer.Store) writer.Store, mw ...func(http.Handler) http.Handler) (string, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), pg.MigratedDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var m func(http.Handler) http.Handler
	if len(mw) > 0 {
		m = mw[0]
	}
	srv, err := newWriter(pool, wrap, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv.URL, pool
}

func TestNewRefusesABadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	if _, err := client.New("http://x", client.WithRetry(client.Retry{})); err == nil {
		t.Error("a retry of 0 attempts was accepted")
	}
}

// Every class of error answer is typed: status, code, and errors.Is.
func TestErrorsAreTyped(t *testing.T) {
	ctx := t.Context()
	c := newClient(t, writerURL)
	if _, err := c.Put(ctx, contract.Document{Key: "typed", Version: 1, Body: "a"}); err != nil {
		t.Fatal(err)
	}
	noToken, err := client.New(writerURL, fast)
	if err != nil {
		t.Fatal(err)
	}
	reader := newClient(t, writerURL, client.WithToken(readToken))
	tests := []struct {
		name   string
		call   func() error
		status int
		code   string
		class  []error
	}{
		{"conflict", func() error {
			_, err := c.Put(ctx, contract.Document{Key: "typed", Version: 1, Body: "b"})
			return err
		}, 409, client.CodeVersionConflict, []error{client.ErrVersionConflict}},
		{"not found", func() error { _, err := c.Get(ctx, "never-written"); return err }, 404, client.CodeNotFound, []error{client.ErrNotFound}},
		{"no token", func() error { _, err := noToken.Get(ctx, "typed"); return err }, 401, client.CodeUnauthorized, []error{client.ErrUnauthorized}},
		{"read token writing", func() error {
			_, err := reader.Delete(ctx, "typed", 2)
			return err
		}, 403, client.CodeForbidden, []error{client.ErrForbidden}},
		{"invalid version", func() error {
			_, err := c.Put(ctx, contract.Document{Key: "typed", Version: 0})
			return err
		}, 422, client.CodeInvalidVersion, []error{client.ErrInvalid}},
		{"too large", func() error {
			_, err := c.Put(ctx, contract.Document{Key: "typed", Version: 2, Title: strings.Repeat("t", contract.MaxTitleBytes+1)})
			return err
		}, 413, client.CodeTitleTooLong, []error{client.ErrInvalid, client.ErrTooLarge}},
		{"bad key, before sending", func() error { _, err := c.Get(ctx, "a\x00b"); return err }, 0, client.CodeKeyControlChar, []error{client.ErrInvalid}},
		{"re-emission refused to a writer", func() error {
			_, err := reader.Reemit(ctx, []string{"typed"})
			return err
		}, 403, client.CodeForbidden, []error{client.ErrForbidden}},
	}
	all := []error{client.ErrInvalid, client.ErrTooLarge, client.ErrVersionConflict, client.ErrNotFound,
		client.ErrUnauthorized, client.ErrForbidden, client.ErrUnavailable, client.ErrNotReproducible}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("%v (%T), want a *client.Error", err, err)
			}
			if e.StatusCode != tt.status || e.Code != tt.code || e.Message == "" {
				t.Fatalf("%d %s %q, want %d %s", e.StatusCode, e.Code, e.Message, tt.status, tt.code)
			}
			for _, class := range all {
				if want := slices.Contains(tt.class, class); errors.Is(err, class) != want {
					t.Errorf("errors.Is(%v, %v) = %v", err, class, !want)
				}
			}
		})
	}
}

// The client's codes are exactly the spec's.
func TestCodesAreTheSpec(t *testing.T) {
	var doc any
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	spec := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				if code, ok := props["code"].(map[string]any); ok {
					for _, c := range code["enum"].([]any) {
						spec[c.(string)] = true
					}
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	src, err := os.ReadFile("errors.go")
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, line := range strings.Split(string(src), "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), "= \"")
		if ok && strings.HasPrefix(name, "Code") {
			mine[strings.TrimSuffix(value, "\"")] = true
		}
	}
	keys := func(m map[string]bool) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if !reflect.DeepEqual(keys(spec), keys(mine)) || len(mine) < 30 {
		t.Fatalf("the spec's codes\n  %v\nthe client's\n  %v", keys(spec), keys(mine))
	}
}

// flaky answers 503 to the first n requests, then passes them on.
func flaky(t *testing.T, n int32, target string) (string, *atomic.Int32) {
	u, _ := url.Parse(target)
	proxy := httputil.NewSingleHostReverseProxy(u)
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) <= n {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(503)
			fmt.Fprint(w, `{"error":{"code":"store_unavailable","message":"the document store is unavailable; nothing was written, retry later"}}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &seen
}

func TestRetriesWhatTheWriterDidNotWrite(t *testing.T) {
	ctx := t.Context()
	base, seen := flaky(t, 2, writerURL)
	res, err := newClient(t, base).Put(ctx, contract.Document{Key: "retried", Version: 1, Body: "x"})
	if err != nil || res.Result != client.Applied || seen.Load() != 3 {
		t.Fatalf("%+v %v after %d requests, want applied after 3", res, err, seen.Load())
	}
	base, seen = flaky(t, 10, writerURL)
	_, err = newClient(t, base, client.WithRetry(client.Retry{Attempts: 2, Base: time.Millisecond})).Get(ctx, "retried")
	if !errors.Is(err, client.ErrUnavailable) || seen.Load() != 2 {
		t.Fatalf("%v after %d requests, want ErrUnavailable after 2", err, seen.Load())
	}
	// Not answered at all: retried too, then the transport's error.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err = newClient(t, dead.URL).Get(ctx, "retried")
	if err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("a writer that is down: %v", err)
	}
	// A refusal is never retried.
	base, seen = flaky(t, 0, writerURL)
	if _, err := newClient(t, base).Put(ctx, contract.Document{Key: "retried", Version: 1, Body: "y"}); !errors.Is(err, client.ErrVersionConflict) || seen.Load() != 1 {
		t.Fatalf("%v after %d requests, want one conflict", err, seen.Load())
	}
}

// failingStore fails the Apply calls whose number (from 1) fail says,
// with an error of Postgres being down.
type failingStore struct {
	writer.Store
	calls atomic.Int32
	fail  func(call int32) bool
}

func (f *failingStore) Apply(ctx context.Context, w []docstore.Write) ([]docstore.Outcome, error) {
	if f.fail(f.calls.Add(1)) {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connection refused")
	}
	return f.Store.Apply(ctx, w)
}

func docs(n int) func(func(client.Write) bool) {
	return func(yield func(client.Write) bool) {
		for i := range n {
			if !yield(client.Write{Doc: contract.Document{Key: fmt.Sprintf("d/%05d", i), Version: 1, Body: fmt.Sprintf("body %d", i)}}) {
				return
			}
		}
	}
}

// When the store fails mid-batch, the writer answers that transaction's
// lines store_unavailable and reads no further; the client sends them and
// the rest again, and every line is answered once, applied once.
func TestBatchSendsAgainWhatTheStoreDidNotWrite(t *testing.T) {
	var store *failingStore
	base, pool := ownWriter(t, func(s writer.Store) writer.Store {
		store = &failingStore{Store: s, fail: func(call int32) bool { return call == 3 || call == 7 || call == 8 }}
		return store
	})
	const n = 1000
	answers := make([]int, n)
	stats, err := newClient(t, base).Batch(t.Context(), docs(n), func(r client.LineResult) error {
		if r.Err != nil {
			return fmt.Errorf("line %d: %w", r.Index, r.Err)
		}
		if r.Result.Result != client.Applied {
			return fmt.Errorf("line %d: %s", r.Index, r.Result.Result)
		}
		answers[r.Index]++
		return nil
	})
	if err != nil {
		t.Fatalf("%v (%+v)", err, stats)
	}
	for i, a := range answers {
		if a != 1 {
			t.Fatalf("line %d answered %d times", i, a)
		}
	}
	if stats.Requests < 3 || stats.Resent == 0 || stats.Applied != n || stats.Lines != n {
		t.Fatalf("%+v: want every line applied after requests sent again", stats)
	}
	var stored int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM documents`).Scan(&stored); err != nil || stored != n {
		t.Fatalf("%d documents stored (%v), want %d", stored, err, n)
	}
	t.Logf("%+v, %d transactions", stats, store.calls.Load())
	// The writer closes the body it stopped reading (golang/go#68560).
	if strings.Contains(serverErrors.String(), "panic") {
		t.Fatalf("the writer's server panicked:\n%s", serverErrors.String())
	}

	// A store that stays down: the batch gives up after the attempts.
	base, _ = ownWriter(t, func(s writer.Store) writer.Store {
		return &failingStore{Store: s, fail: func(int32) bool { return true }}
	})
	_, err = newClient(t, base, client.WithRetry(client.Retry{Attempts: 3, Base: time.Millisecond})).Batch(t.Context(), docs(10), func(client.LineResult) error { return nil })
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "10 lines unanswered after 3 attempts") {
		t.Fatalf("a store that stays down: %v", err)
	}
}

// blockingStore holds each Apply until released.
type blockingStore struct {
	writer.Store
	gate chan struct{}
}

func (b *blockingStore) Apply(ctx context.Context, w []docstore.Write) ([]docstore.Outcome, error) {
	select {
	case <-b.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.Store.Apply(ctx, w)
}

// A batch pulls its input only as fast as the writer reads it: with the
// store stalled, the lines pulled stay a few transactions and the
// connection's buffers ahead of the writer, not the whole input.
func TestBatchPullsOnlyWhatTheWriterTakes(t *testing.T) {
	gate := make(chan struct{})
	base, _ := ownWriter(t, func(s writer.Store) writer.Store { return &blockingStore{Store: s, gate: gate} })
	const n, size = 4000, 16 << 10
	body := strings.Repeat("x", size)
	var pulled atomic.Int32
	writes := func(yield func(client.Write) bool) {
		for i := range n {
			pulled.Add(1)
			if !yield(client.Write{Doc: contract.Document{Key: fmt.Sprintf("p/%05d", i), Version: 1, Body: body}}) {
				return
			}
		}
	}
	var wg sync.WaitGroup
	var stats client.BatchStats
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		stats, err = newClient(t, base).Batch(t.Context(), writes, func(client.LineResult) error { return nil })
	}()
	time.Sleep(time.Second)
	stalled := pulled.Load()
	// The writer reads a transaction (50 lines) and waits in Apply; the
	// connection holds some megabytes more. The whole input is 64 MiB.
	if stalled >= n/2 {
		t.Fatalf("%d of %d lines pulled while the store was stalled", stalled, n)
	}
	close(gate)
	wg.Wait()
	if err != nil || stats.Applied != n {
		t.Fatalf("%+v %v", stats, err)
	}
	t.Logf("pulled while stalled: %d lines of %d KiB (%.1f MiB) of %d", stalled, size>>10, float64(stalled)*size/(1<<20), n)
}

func TestTLSWithTheWritersCertificate(t *testing.T) {
	u, _ := url.Parse(writerURL)
	srv := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(u))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newClient(t, srv.URL, client.WithCAFile(ca)).Put(t.Context(), contract.Document{Key: "tls", Version: 1}); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	start := time.Now()
	_, err := newClient(t, srv.URL).Get(t.Context(), "tls")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an untrusted certificate: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("an untrusted certificate was retried (%v)", time.Since(start))
	}
	if _, err := client.New(srv.URL, client.WithCAFile(filepath.Join(t.TempDir(), "none"))); err == nil {
		t.Error("a missing CA file was accepted")
	}
}

func TestReemit(t *testing.T) {
	ctx := t.Context()
	c := newClient(t, writerURL)
	put, err := c.Put(ctx, contract.Document{Key: "again", Version: 4, Body: "b"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Reemit(ctx, []string{"again", "nobody"})
	if err != nil || len(res.Reemitted) != 1 || res.Reemitted[0].EventID != put.EventID || res.Reemitted[0].Version != 4 ||
		!slices.Equal(res.NotFound, []string{"nobody"}) {
		t.Fatalf("%+v %v", res, err)
	}
}

// cutAnswer aborts the connection of the first batch request once the
// writer has written limit bytes of its answer: what it answered after
// that never reaches the client, though it was written to Postgres.
func cutAnswer(limit int) func(http.Handler) http.Handler {
	var cut atomic.Bool
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/documents:batch" && cut.CompareAndSwap(false, true) {
				w = &cutWriter{ResponseWriter: w, left: limit}
			}
			next.ServeHTTP(w, r)
		})
	}
}

type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) >= c.left {
		n, _ := c.ResponseWriter.Write(p[:c.left])
		c.Flush()
		_ = n
		panic(http.ErrAbortHandler) // the connection breaks mid-answer
	}
	c.left -= len(p)
	return c.ResponseWriter.Write(p)
}

func (c *cutWriter) Flush() { http.NewResponseController(c.ResponseWriter).Flush() }

func (c *cutWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// A connection that breaks mid-answer: the lines whose answers were lost
// are sent again (the writer answers those it had written "unchanged"),
// and every line is answered once. A line that cannot even be encoded is
// answered by the client, without being sent, in its turn.
func TestBatchSendsAgainWhatTheBrokenConnectionLeftUnanswered(t *testing.T) {
	base, pool := ownWriter(t, nil, cutAnswer(3000))
	const n = 400
	writes := func(yield func(client.Write) bool) {
		for i := range n {
			doc := contract.Document{Key: fmt.Sprintf("c/%04d", i), Version: 1, Body: "b"}
			if i == 7 {
				doc.Meta = []byte("{not json")
			}
			if !yield(client.Write{Doc: doc}) {
				return
			}
		}
	}
	answers := make([]int, n)
	var unchanged int
	stats, err := newClient(t, base).Batch(t.Context(), writes, func(r client.LineResult) error {
		answers[r.Index]++
		switch {
		case r.Index == 7:
			var e *client.Error
			if !errors.As(r.Err, &e) || e.StatusCode != 0 || e.Code != client.CodeInvalidMeta {
				return fmt.Errorf("line 7: %w, want a refusal before sending", r.Err)
			}
		case r.Err != nil:
			return fmt.Errorf("line %d: %w", r.Index, r.Err)
		case r.Result.Result == client.Unchanged:
			unchanged++
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v (%+v)", err, stats)
	}
	for i, a := range answers {
		if a != 1 {
			t.Fatalf("line %d answered %d times", i, a)
		}
	}
	if stats.Requests < 2 || stats.Resent == 0 || stats.Failed != 1 || stats.Applied+stats.Unchanged != n-1 {
		t.Fatalf("%+v: want the lines the cut answer lost sent again", stats)
	}
	var stored int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM documents`).Scan(&stored); err != nil || stored != n-1 {
		t.Fatalf("%d documents stored (%v), want %d", stored, err, n-1)
	}
	t.Logf("%+v; %d answered unchanged: written before the cut, their answers lost", stats, unchanged)
}
