package embed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// fakeVector is what the test servers return for a text: the text's length
// and the sum of its bytes in the first two entries, then ones; not unit
// length, so that normalisation shows.
func fakeVector(text string, dim int) []float32 {
	v := make([]float32, dim)
	for i := range v {
		v[i] = 1
	}
	v[0] = float32(len(text))
	var sum int
	for _, b := range []byte(text) {
		sum += int(b)
	}
	if dim > 1 {
		v[1] = float32(sum % 1000)
	}
	return v
}

func unit(v []float32) []float32 {
	out := make([]float32, len(v))
	n := norm(v)
	for i, x := range v {
		out[i] = float32(float64(x) / n)
	}
	return out
}

type embeddingItem struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float32 `json:"embedding"`
}

// embeddings writes an OpenAI-shaped response for texts, listing the
// embeddings in reverse order of index.
func embeddings(w http.ResponseWriter, model string, texts []string, dim int) {
	data := make([]embeddingItem, 0, len(texts))
	for i := len(texts) - 1; i >= 0; i-- {
		data = append(data, embeddingItem{Object: "embedding", Index: i, Embedding: fakeVector(texts[i], dim)})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data":   data,
		"model":  model,
		"usage":  map[string]int{"prompt_tokens": 1, "total_tokens": 1},
	})
}

func decodeRequest(t *testing.T, r *http.Request) embeddingRequest {
	t.Helper()
	var req embeddingRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		t.Errorf("request body: %v", err)
	}
	return req
}

// newTestHTTP is an HTTP embedder of srv with short retry delays.
func newTestHTTP(t *testing.T, srv *httptest.Server, cfg HTTPConfig) *HTTP {
	t.Helper()
	cfg.URL = srv.URL
	if cfg.Model == "" {
		cfg.Model = "test-model"
	}
	if cfg.Dimension == 0 {
		cfg.Dimension = 4
	}
	e, err := NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.backoffBase, e.backoffMax = time.Millisecond, 4*time.Millisecond
	return e
}

func texts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("text number %d", i)
	}
	return out
}

func TestHTTPBatching(t *testing.T) {
	var (
		mu    sync.Mutex
		sizes []int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		req := decodeRequest(t, r)
		if req.Model != "text-embedding-3-small" {
			t.Errorf("model %q", req.Model)
		}
		mu.Lock()
		sizes = append(sizes, len(req.Input))
		mu.Unlock()
		embeddings(w, req.Model, req.Input, 5)
	}))
	defer srv.Close()

	e := newTestHTTP(t, srv, HTTPConfig{Model: "text-embedding-3-small", Dimension: 5, BatchSize: 4})
	if e.Name() != "text-embedding-3-small" || e.Dimension() != 5 {
		t.Fatalf("Name %q, Dimension %d", e.Name(), e.Dimension())
	}
	in := texts(10)
	got, err := e.Embed(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(sizes) // the batches are sent at once
	if !slices.Equal(sizes, []int{2, 4, 4}) {
		t.Errorf("batch sizes %v, want 4, 4 and 2", sizes)
	}
	if len(got) != len(in) {
		t.Fatalf("%d vectors for %d texts", len(got), len(in))
	}
	for i, text := range in {
		if want := unit(fakeVector(text, 5)); !closeTo(got[i], want, 1e-6) {
			t.Errorf("vector %d = %v, want %v", i, got[i], want)
		}
		if n := norm(got[i]); math.Abs(n-1) > 1e-6 {
			t.Errorf("vector %d: norm %v", i, n)
		}
		if cap(got[i]) != 5 {
			t.Errorf("vector %d: capacity %d", i, cap(got[i]))
		}
	}

	sizes = nil
	if got, err := e.Embed(context.Background(), nil); err != nil || len(got) != 0 || len(sizes) != 0 {
		t.Errorf("no texts: %v, %v, %d requests", got, err, len(sizes))
	}
}

func TestHTTPDefaultBatchSize(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		mu.Lock()
		sizes = append(sizes, len(req.Input))
		mu.Unlock()
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{})
	if _, err := e.Embed(context.Background(), texts(130)); err != nil {
		t.Fatal(err)
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{2, 64, 64}) {
		t.Errorf("batch sizes %v, want 64, 64 and 2", sizes)
	}
}

// Two callers embedding at once share the embedder's concurrency: the
// server never holds more requests than it, and holds that many.
func TestHTTPConcurrencyIsSharedByItsCallers(t *testing.T) {
	var inFlight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{BatchSize: 2, Concurrency: 3})
	var g errgroup.Group
	for range 2 {
		g.Go(func() error {
			_, err := e.Embed(context.Background(), texts(20)) // 10 requests each
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := most.Load(); got != 3 {
		t.Fatalf("at most %d requests in flight, want 3 (the concurrency)", got)
	}
}

// A 429 with Retry-After pauses every request of the embedder, not only
// the refused one: nothing is sent to the server until the pause it asked
// for has passed, and then every text is embedded.
func TestHTTPRetryAfterPausesEveryRequest(t *testing.T) {
	const pause = 300 * time.Millisecond
	var mu sync.Mutex
	var refusedAt time.Time
	var after []time.Duration // when each request after the refusal arrived, from it
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		mu.Lock()
		if refusedAt.IsZero() {
			refusedAt = time.Now()
			mu.Unlock()
			w.Header().Set("Retry-After-Ms", strconv.Itoa(int(pause/time.Millisecond)))
			http.Error(w, `{"error": {"message": "rate limited"}}`, http.StatusTooManyRequests)
			return
		}
		after = append(after, time.Since(refusedAt))
		mu.Unlock()
		time.Sleep(30 * time.Millisecond) // the requests already sent are still here when the 429 is answered
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{BatchSize: 1, Concurrency: 4})
	got, err := e.Embed(context.Background(), texts(12))
	if err != nil || len(got) != 12 {
		t.Fatalf("%d vectors, %v", len(got), err)
	}
	early := 0
	for _, d := range after {
		if d < pause-20*time.Millisecond {
			early++
		}
	}
	// The three sent beside the refused one arrive at once; none after.
	if early > 3 {
		t.Fatalf("%d requests reached the server within the %v it asked to be left alone (arrivals %v)", early, pause, after)
	}
}

func TestHTTPAuthorization(t *testing.T) {
	for _, key := range []string{"sk-test-123", ""} {
		var got []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r.Header.Values("Authorization")
			req := decodeRequest(t, r)
			embeddings(w, req.Model, req.Input, 4)
		}))
		e := newTestHTTP(t, srv, HTTPConfig{APIKey: key})
		if _, err := e.Embed(context.Background(), []string{"x"}); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		want := []string{"Bearer " + key}
		if key == "" {
			want = nil
		}
		if !slices.Equal(got, want) {
			t.Errorf("APIKey %q: Authorization %q, want %q", key, got, want)
		}
	}
}

// failingServer answers the first len(fail) requests with fail[i] (a
// status and headers) and then embeds; it records when requests arrive.
type failingServer struct {
	*httptest.Server
	mu    sync.Mutex
	times []time.Time
}

type failure struct {
	status int
	header map[string]string
	body   string
}

func newFailingServer(t *testing.T, fail ...failure) *failingServer {
	s := &failingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		s.mu.Lock()
		n := len(s.times)
		s.times = append(s.times, time.Now())
		s.mu.Unlock()
		if n < len(fail) {
			for k, v := range fail[n].header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(fail[n].status)
			fmt.Fprint(w, fail[n].body)
			return
		}
		embeddings(w, req.Model, req.Input, 4)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *failingServer) requests() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.times)
}

func TestHTTPRetries(t *testing.T) {
	rateLimited := failure{status: 429, body: `{"error":{"message":"Rate limit reached","type":"requests"}}`}
	unavailable := failure{status: 503, body: "upstream unavailable"}
	for _, tc := range []struct {
		name     string
		fail     []failure
		retries  int
		requests int
		ok       bool
	}{
		{"429 then success", []failure{rateLimited}, 0, 2, true},
		{"5xx then success", []failure{unavailable, {status: 500}, {status: 502}}, 0, 4, true},
		{"retries exhausted", []failure{unavailable, unavailable, unavailable, unavailable}, 2, 3, false},
		{"no retries", []failure{rateLimited}, -1, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFailingServer(t, tc.fail...)
			e := newTestHTTP(t, srv.Server, HTTPConfig{MaxRetries: tc.retries})
			got, err := e.Embed(context.Background(), []string{"a", "b"})
			if n := len(srv.requests()); n != tc.requests {
				t.Errorf("%d requests, want %d", n, tc.requests)
			}
			if !tc.ok {
				var serr *StatusError
				if !errors.As(err, &serr) || !serr.SafeToRetry() {
					t.Fatalf("err = %v, want a retryable *StatusError", err)
				}
				if tc.requests > 1 && !strings.Contains(err.Error(), fmt.Sprintf("%d attempts", tc.requests)) {
					t.Errorf("error %q does not count the attempts", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !closeTo(got[1], unit(fakeVector("b", 4)), 1e-6) {
				t.Errorf("vector %v", got[1])
			}
		})
	}
}

func TestHTTPRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		header map[string]string
		min    time.Duration
	}{
		{map[string]string{"Retry-After": "1"}, time.Second},
		{map[string]string{"Retry-After-Ms": "300"}, 300 * time.Millisecond},
		{map[string]string{"Retry-After": "0.25"}, 250 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tc.header), func(t *testing.T) {
			srv := newFailingServer(t, failure{status: 429, header: tc.header})
			e := newTestHTTP(t, srv.Server, HTTPConfig{})
			if _, err := e.Embed(context.Background(), []string{"a"}); err != nil {
				t.Fatal(err)
			}
			times := srv.requests()
			if len(times) != 2 {
				t.Fatalf("%d requests, want 2", len(times))
			}
			// The backoff alone is at most 4ms here.
			if d := times[1].Sub(times[0]); d < tc.min {
				t.Errorf("retried after %s, the server asked for %s", d, tc.min)
			}
		})
	}

	// A wait longer than the embedder accepts ends the retries at once.
	srv := newFailingServer(t, failure{status: 503, header: map[string]string{"Retry-After": "3600"}})
	e := newTestHTTP(t, srv.Server, HTTPConfig{})
	start := time.Now()
	_, err := e.Embed(context.Background(), []string{"a"})
	var serr *StatusError
	if !errors.As(err, &serr) || serr.StatusCode != 503 || !strings.Contains(err.Error(), "retry after 1h0m0s") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second || len(srv.requests()) != 1 {
		t.Errorf("took %s and %d requests", d, len(srv.requests()))
	}
}

func TestHTTPNoRetryOnClientError(t *testing.T) {
	long := strings.Repeat("é", 5000)
	for _, tc := range []struct {
		body, want string
	}{
		{`{"error":{"message":"'input' is invalid","type":"invalid_request_error"}}`, "'input' is invalid"},
		{`{"error":"model not found"}`, "model not found"},
		{`{"object":"error","message":"too many tokens"}`, "too many tokens"},
		{"plain\n  text", "plain text"},
		{`{"error":{"message":"` + long + `"}}`, strings.Repeat("é", maxErrorMessage/2) + "…"},
	} {
		srv := newFailingServer(t, failure{status: 400, body: tc.body})
		e := newTestHTTP(t, srv.Server, HTTPConfig{})
		_, err := e.Embed(context.Background(), []string{"a"})
		var serr *StatusError
		if !errors.As(err, &serr) {
			t.Fatalf("err = %v, want *StatusError", err)
		}
		if serr.StatusCode != 400 || serr.SafeToRetry() || serr.Message != tc.want {
			t.Errorf("body %.40q: status %d, message %q, want %q", tc.body, serr.StatusCode, serr.Message, tc.want)
		}
		if !strings.Contains(err.Error(), "400 Bad Request") || !strings.Contains(err.Error(), "test-model") {
			t.Errorf("error %q names neither the status nor the model", err)
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	}
}

func TestHTTPDimensionMismatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		embeddings(w, req.Model, req.Input, 3)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{Dimension: 1536})
	_, err := e.Embed(context.Background(), []string{"a"})
	var derr *DimensionError
	if !errors.As(err, &derr) || derr.Got != 3 || derr.Want != 1536 {
		t.Fatalf("err = %v, want a *DimensionError of 3 and 1536", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "3 dimensions") || !strings.Contains(msg, "1536") {
		t.Errorf("error %q does not name both dimensions", msg)
	}
}

func TestHTTPTimeout(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		if calls.Add(1) == 1 {
			<-r.Context().Done() // hang until the client gives up
			return
		}
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()

	// Without retries the timeout is the error.
	e := newTestHTTP(t, srv, HTTPConfig{Timeout: 100 * time.Millisecond, MaxRetries: -1})
	start := time.Now()
	_, err := e.Embed(context.Background(), []string{"a"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout of 100ms took %s", d)
	}

	// With retries the next attempt succeeds.
	calls.Store(0)
	e = newTestHTTP(t, srv, HTTPConfig{Timeout: 100 * time.Millisecond})
	if _, err := e.Embed(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestHTTPNetworkErrorRetried(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		if calls.Add(1) == 1 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close() // no response at all
			return
		}
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{})
	if _, err := e.Embed(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestHTTPCancellation(t *testing.T) {
	t.Run("during a request", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			decodeRequest(t, r) // the server notices a closed connection once the body is read
			<-r.Context().Done()
		}))
		defer srv.Close()
		e := newTestHTTP(t, srv, HTTPConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := e.Embed(ctx, []string{"a"})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("returned %s after the cancellation", d)
		}
	})
	t.Run("while waiting to retry", func(t *testing.T) {
		srv := newFailingServer(t, failure{status: 503, header: map[string]string{"Retry-After": "60"}, body: "busy"})
		e := newTestHTTP(t, srv.Server, HTTPConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		_, err := e.Embed(ctx, []string{"a"})
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "busy") {
			t.Fatalf("err = %v, want context.Canceled and the last attempt's error", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("returned %s after the cancellation", d)
		}
	})
	t.Run("before the call", func(t *testing.T) {
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
		defer srv.Close()
		e := newTestHTTP(t, srv, HTTPConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := e.Embed(ctx, []string{"a"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if n := calls.Load(); n != 0 {
			t.Errorf("%d requests", n)
		}
	})
}

func TestHTTPConcurrent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := decodeRequest(t, r)
		embeddings(w, req.Model, req.Input, 4)
	}))
	defer srv.Close()
	e := newTestHTTP(t, srv, HTTPConfig{BatchSize: 3})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			in := texts(10 + g)
			got, err := e.Embed(context.Background(), in)
			if err != nil {
				t.Error(err)
				return
			}
			for i, text := range in {
				if !closeTo(got[i], unit(fakeVector(text, 4)), 1e-6) {
					t.Errorf("goroutine %d, vector %d: %v", g, i, got[i])
				}
			}
		})
	}
	wg.Wait()
}

func TestDecodeResponse(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		n          int
		want       [][]float32 // nil: an error
	}{
		{"in order", `{"data":[{"index":0,"embedding":[3,4]},{"index":1,"embedding":[0,2]}]}`, 2,
			[][]float32{{0.6, 0.8}, {0, 1}}},
		{"out of order", `{"data":[{"index":1,"embedding":[0,2]},{"index":0,"embedding":[3,4]}]}`, 2,
			[][]float32{{0.6, 0.8}, {0, 1}}},
		{"too few", `{"data":[{"index":0,"embedding":[3,4]}]}`, 2, nil},
		{"too many", `{"data":[{"index":0,"embedding":[3,4]},{"index":1,"embedding":[3,4]}]}`, 1, nil},
		{"duplicate index", `{"data":[{"index":0,"embedding":[3,4]},{"index":0,"embedding":[3,4]}]}`, 2, nil},
		{"index out of range", `{"data":[{"index":0,"embedding":[3,4]},{"index":2,"embedding":[3,4]}]}`, 2, nil},
		{"negative index", `{"data":[{"index":-1,"embedding":[3,4]}]}`, 1, nil},
		{"no index", `{"data":[{"embedding":[3,4]}]}`, 1, nil},
		{"zero vector", `{"data":[{"index":0,"embedding":[0,0]}]}`, 1, nil},
		{"overflow", `{"data":[{"index":0,"embedding":[1e39,0]}]}`, 1, nil},
		{"base64", `{"data":[{"index":0,"embedding":"AAAA"}]}`, 1, nil},
		{"short vector", `{"data":[{"index":0,"embedding":[1]}]}`, 1, nil},
		{"not json", `<html>gateway</html>`, 1, nil},
		{"no data", `{}`, 1, nil},
	} {
		dst := make([]float32, tc.n*2)
		err := decodeResponse([]byte(tc.body), tc.n, dst)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%s: no error", tc.name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for i, w := range tc.want {
			if !closeTo(dst[i*2:i*2+2], w, 1e-7) {
				t.Errorf("%s: vector %d = %v, want %v", tc.name, i, dst[i*2:i*2+2], w)
			}
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"data":[{"index":1,"embedding":[0,2,1]},{"index":0,"embedding":[3,4,5]}]}`), 2)
	f.Add([]byte(`{"data":[{"index":0,"embedding":[1e-45,0,0]}]}`), 1)
	f.Add([]byte(`{"data":[{"index":0,"embedding":[3.4e38,3.4e38,3.4e38]}]}`), 1)
	f.Add([]byte(`{"data":[]}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		if n < 0 || n > 100 {
			return
		}
		dst := make([]float32, n*3)
		if decodeResponse(body, n, dst) != nil {
			return
		}
		for i := range n {
			v := dst[i*3 : i*3+3]
			if nv := norm(v); math.Abs(nv-1) > 1e-5 {
				t.Fatalf("vector %d = %v, norm %v", i, v, nv)
			}
		}
	})
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		header map[string]string
		want   time.Duration
	}{
		{nil, 0},
		{map[string]string{"Retry-After": "7"}, 7 * time.Second},
		{map[string]string{"Retry-After": " 2 "}, 2 * time.Second},
		{map[string]string{"Retry-After": "0"}, 0},
		{map[string]string{"Retry-After": "-3"}, 0},
		{map[string]string{"Retry-After": "1e300"}, 0},
		{map[string]string{"Retry-After": "soon"}, 0},
		{map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second},
		{map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, 0},
		{map[string]string{"Retry-After-Ms": "1500"}, 1500 * time.Millisecond},
		{map[string]string{"Retry-After-Ms": "20", "Retry-After": "1"}, 20 * time.Millisecond},
		{map[string]string{"Retry-After-Ms": "x", "Retry-After": "1"}, time.Second},
	} {
		h := http.Header{}
		for k, v := range tc.header {
			h.Set(k, v)
		}
		if got := retryAfter(h, now); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.header, got, tc.want)
		}
	}
}

// The backoff is the shared one over backoffBase and backoffMax: doubled
// per failed attempt up to the cap, half of it random.
func TestBackoff(t *testing.T) {
	e := &HTTP{backoffBase: 100 * time.Millisecond, backoffMax: time.Second}
	for attempt, ceiling := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 800, 5: 1000, 80: 1000} {
		ceiling *= time.Millisecond
		seen := map[time.Duration]bool{}
		for range 200 {
			d := e.backoff(attempt)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("backoff(%d) = %s, want in [%s, %s]", attempt, d, ceiling/2, ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("backoff(%d): only %d distinct delays: no jitter", attempt, len(seen))
		}
	}
}

func TestEndpointURL(t *testing.T) {
	for _, tc := range []struct {
		base, want string
	}{
		{"https://api.openai.com", "https://api.openai.com/v1/embeddings"},
		{"https://api.openai.com/", "https://api.openai.com/v1/embeddings"},
		{"https://api.openai.com/v1", "https://api.openai.com/v1/embeddings"},
		{"https://api.openai.com/v1/", "https://api.openai.com/v1/embeddings"},
		{"http://127.0.0.1:11434", "http://127.0.0.1:11434/v1/embeddings"},
		{"http://gateway/openai?key=1", "http://gateway/openai/v1/embeddings?key=1"},
		{"", ""},
		{"localhost:8080", ""},
		{"ftp://host", ""},
		{"http://", ""},
		{"http://a b", ""},
	} {
		u, err := endpointURL(tc.base)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%q: %s, want an error", tc.base, u)
		case tc.want != "" && err != nil:
			t.Errorf("%q: %v", tc.base, err)
		case tc.want != "" && u.String() != tc.want:
			t.Errorf("%q: %s, want %s", tc.base, u, tc.want)
		}
	}
}

func TestNewHTTPValidation(t *testing.T) {
	ok := HTTPConfig{URL: "http://127.0.0.1:1", Model: "m", Dimension: 8}
	for _, tc := range []struct {
		name string
		edit func(*HTTPConfig)
		want string // part of the error; "" for none
	}{
		{"valid", func(*HTTPConfig) {}, ""},
		{"no URL", func(c *HTTPConfig) { c.URL = "" }, "no URL"},
		{"no model", func(c *HTTPConfig) { c.Model = "" }, "no model"},
		{"no dimension", func(c *HTTPConfig) { c.Dimension = 0 }, "dimension"},
		{"negative batch", func(c *HTTPConfig) { c.BatchSize = -1 }, "batch"},
		{"negative timeout", func(c *HTTPConfig) { c.Timeout = -time.Second }, "timeout"},
		{"credentials hidden", func(c *HTTPConfig) { c.URL = "ftp://user:secret@host" }, "user:xxxxx@host"},
	} {
		cfg := ok
		tc.edit(&cfg)
		_, err := NewHTTP(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	e, err := NewHTTP(ok)
	if err != nil {
		t.Fatal(err)
	}
	if e.batchSize != DefaultBatchSize || e.timeout != DefaultTimeout || e.maxRetries != DefaultMaxRetries || e.client == nil {
		t.Errorf("defaults: batch %d, timeout %s, retries %d", e.batchSize, e.timeout, e.maxRetries)
	}
}
