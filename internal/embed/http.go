package embed

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/retry"
)

// Defaults of [HTTPConfig].
const (
	DefaultBatchSize  = 64
	DefaultTimeout    = 30 * time.Second
	DefaultMaxRetries = 5
	// DefaultConcurrency is how many requests are in flight at most, over
	// every caller of one embedder.
	DefaultConcurrency = 4
	// MaxBatchSize and MaxConcurrency bound the settings.
	MaxBatchSize   = 2048
	MaxConcurrency = 256
)

const (
	// The backoff after failed attempt i (from 1) is a random duration in
	// [b/2, b] with b = min(backoffBase * 2^(i-1), backoffMax): the shared
	// retry.Backoff with its default jitter.
	backoffBase = 500 * time.Millisecond
	backoffMax  = 30 * time.Second
	// A server asking to wait longer than this is not waited for: its error
	// is returned, so that a worker is not silently stalled for long (an
	// exhausted quota, typically).
	maxRetryAfter = 2 * time.Minute
	// Bytes of an error body read, and of the message kept from it.
	maxErrorBody    = 64 << 10
	maxErrorMessage = 512
)

// HTTPConfig configures an [HTTP] embedder. Zero fields take the defaults
// documented on them.
type HTTPConfig struct {
	// URL is the server's base URL, e.g. "https://api.openai.com"; requests
	// go to URL + "/v1/embeddings". A URL already ending in "/v1" gets
	// "/embeddings" only.
	URL string
	// Model is sent with every request and is the embedder's Name.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// Dimension is the length of the vectors the model returns; required.
	// A vector of another length is a [*DimensionError].
	Dimension int
	// BatchSize is the number of texts per request: the size the
	// endpoint serves best. Default 64.
	BatchSize int
	// Concurrency is how many requests are in flight at most, shared by
	// every call of the embedder (the projector's shards included): a
	// call's batches are sent at once up to it. Default 4.
	Concurrency int
	// Timeout bounds each attempt of a request, reading the response
	// included. Default 30s.
	Timeout time.Duration
	// MaxRetries is the number of retries after a failed attempt (429, 5xx,
	// network error or timeout). Default 5; negative: none.
	MaxRetries int
	// Client sends the requests. Default: a client of its own over
	// [http.DefaultTransport].
	Client *http.Client
}

// Validate reports a missing or malformed field.
func (c HTTPConfig) Validate() error {
	if _, err := endpointURL(c.URL); err != nil {
		return err
	}
	if c.Model == "" {
		return errors.New("embed: no model is configured for the embeddings endpoint")
	}
	if c.Dimension <= 0 {
		return fmt.Errorf("embed: the dimension of model %q is not configured (it is the length of the vectors the model returns)", c.Model)
	}
	if c.BatchSize < 0 || c.BatchSize > MaxBatchSize {
		return fmt.Errorf("embed: batch size %d: it must be from 1 to %d (0: the default, %d)", c.BatchSize, MaxBatchSize, DefaultBatchSize)
	}
	if c.Concurrency < 0 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("embed: concurrency %d: it must be from 1 to %d (0: the default, %d)", c.Concurrency, MaxConcurrency, DefaultConcurrency)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("embed: negative timeout %s", c.Timeout)
	}
	return nil
}

// HTTP embeds texts with an OpenAI-compatible embeddings endpoint
// (POST /v1/embeddings). Requests carry at most BatchSize texts; a call's
// requests are sent at once, and at most Concurrency are in flight over
// every call (the rest wait for a slot: back-pressure on the callers). A
// failed attempt is retried with exponential backoff and jitter when the
// server was rate limiting or failing, or the network failed, waiting at
// least as long as the server's Retry-After (or retry-after-ms) asks; and
// while a server that asked so waits, no other request is sent to it
// either (a rate limit is the endpoint's, not one request's). A server
// asking for more than two minutes gets no retry, its error is returned.
// Other 4xx answers are not retried. Vectors are L2-normalised. It is safe
// for concurrent use.
type HTTP struct {
	endpoint   string
	redacted   string // endpoint for messages, without credentials
	model      string
	apiKey     string
	dim        int
	batchSize  int
	slots      chan struct{} // one per request in flight
	timeout    time.Duration
	maxRetries int
	client     *http.Client

	// Retry timing; tests shorten them.
	backoffBase   time.Duration
	backoffMax    time.Duration
	maxRetryAfter time.Duration

	mu        sync.Mutex
	notBefore time.Time // no request is sent before: a server's Retry-After
}

var _ Embedder = (*HTTP)(nil)

// NewHTTP returns an embedder for the endpoint of cfg; it sends nothing.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, _ := endpointURL(cfg.URL) // validated above
	e := &HTTP{
		endpoint:      u.String(),
		redacted:      u.Redacted(),
		model:         cfg.Model,
		apiKey:        cfg.APIKey,
		dim:           cfg.Dimension,
		batchSize:     cfg.BatchSize,
		timeout:       cfg.Timeout,
		maxRetries:    cfg.MaxRetries,
		client:        cfg.Client,
		backoffBase:   backoffBase,
		backoffMax:    backoffMax,
		maxRetryAfter: maxRetryAfter,
	}
	if e.batchSize == 0 {
		e.batchSize = DefaultBatchSize
	}
	concurrency := cfg.Concurrency
	if concurrency == 0 {
		concurrency = DefaultConcurrency
	}
	e.slots = make(chan struct{}, concurrency)
	if e.timeout == 0 {
		e.timeout = DefaultTimeout
	}
	switch {
	case e.maxRetries == 0:
		e.maxRetries = DefaultMaxRetries
	case e.maxRetries < 0:
		e.maxRetries = 0
	}
	if e.client == nil {
		e.client = &http.Client{}
	}
	return e, nil
}

// endpointURL is the embeddings URL of a base URL.
func endpointURL(base string) (*url.URL, error) {
	if base == "" {
		return nil, errors.New("embed: no URL is configured for the embeddings endpoint")
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("embed: embeddings URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("embed: embeddings URL %q is not an http or https URL with a host", u.Redacted())
	}
	path := strings.TrimRight(u.Path, "/")
	if !strings.HasSuffix(path, "/v1") {
		path += "/v1"
	}
	u.Path, u.RawPath = path+"/embeddings", ""
	u.Fragment, u.RawFragment = "", ""
	return u, nil
}

// Name is the model's name.
func (e *HTTP) Name() string { return e.model }

// Dimension is the configured dimension of the model.
func (e *HTTP) Dimension() int { return e.dim }

// BatchSize is the number of texts per request.
func (e *HTTP) BatchSize() int { return e.batchSize }

// Concurrency is how many requests are in flight at most.
func (e *HTTP) Concurrency() int { return cap(e.slots) }

// Embed returns one unit vector per text, in order. Its batches are sent
// at once, within the embedder's concurrency. An error names the first
// batch that failed, and ends the call's other requests; no vector is
// returned then.
func (e *HTTP) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	flat := make([]float32, len(texts)*e.dim)
	out := make([][]float32, len(texts))
	g, gctx := errgroup.WithContext(ctx)
	for start := 0; start < len(texts); start += e.batchSize {
		end := min(start+e.batchSize, len(texts))
		g.Go(func() error {
			if err := e.embedBatch(gctx, texts[start:end], flat[start*e.dim:end*e.dim]); err != nil {
				return fmt.Errorf("embed: model %q at %s, texts %d to %d of %d: %w",
					e.model, e.redacted, start, end-1, len(texts), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i := range texts {
		out[i] = flat[i*e.dim : (i+1)*e.dim : (i+1)*e.dim]
	}
	return out, nil
}

// slot waits for a request slot and for the end of the pause a server
// asked for; release frees the slot.
func (e *HTTP) slot(ctx context.Context) (release func(), err error) {
	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	release = func() { <-e.slots }
	for {
		e.mu.Lock()
		wait := time.Until(e.notBefore)
		e.mu.Unlock()
		if wait <= 0 {
			return release, nil
		}
		// The slot stays held while the server's pause lasts: the other
		// callers wait too, rather than send what it would refuse.
		if err := retry.Sleep(ctx, wait); err != nil {
			release()
			return nil, err
		}
	}
}

// pause holds every request until wait has passed.
func (e *HTTP) pause(wait time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := time.Now().Add(wait); t.After(e.notBefore) {
		e.notBefore = t
	}
}

type embeddingRequest struct {
	Model string   `json:"model"`
	Input []string `json:"input"`
}

// embedBatch writes the vectors of texts into dst, retrying failed attempts.
func (e *HTTP) embedBatch(ctx context.Context, texts []string, dst []float32) error {
	body, err := json.Marshal(embeddingRequest{Model: e.model, Input: texts})
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	for failed := 0; ; failed++ {
		release, err := e.slot(ctx)
		if err != nil {
			return err
		}
		wait, err := e.attempt(ctx, body, len(texts), dst)
		if err != nil && wait > 0 && wait <= e.maxRetryAfter {
			// Before the slot is freed: a request waiting for it must
			// find the pause already set.
			e.pause(wait)
		}
		release()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return joinContextError(ctx, err)
		}
		if wait < 0 {
			return err
		}
		if failed >= e.maxRetries {
			if failed == 0 {
				return err
			}
			return fmt.Errorf("%d attempts failed, the last: %w", failed+1, err)
		}
		if wait > e.maxRetryAfter {
			return fmt.Errorf("the server asks to retry after %s, longer than %s: %w", wait, e.maxRetryAfter, err)
		}
		// The server's Retry-After, when longer, wins over the backoff.
		if retry.Sleep(ctx, max(wait, e.backoff(failed+1))) != nil {
			return joinContextError(ctx, err)
		}
	}
}

// joinContextError is the error of a call whose context ended: it matches
// the context's error and tells the last attempt's error, as text only, so
// that the caller does not take it for a failure of the endpoint.
func joinContextError(ctx context.Context, last error) error {
	cause := context.Cause(ctx)
	if errors.Is(last, cause) {
		return last
	}
	return fmt.Errorf("%w (last attempt: %s)", cause, last.Error())
}

// backoff is the jittered wait after failed attempt number attempt (from
// 1): the shared backoff over backoffBase and backoffMax, half of it
// random to spread the retries of concurrent callers.
func (e *HTTP) backoff(attempt int) time.Duration {
	return retry.Backoff{Min: e.backoffBase, Max: e.backoffMax}.Delay(attempt)
}

// attempt sends one request. On failure, wait < 0 means the error is final;
// otherwise the request may be retried after at least wait (0 when the
// server did not say).
func (e *HTTP) attempt(ctx context.Context, body []byte, n int, dst []float32) (wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.endpoint, bytes.NewReader(body))
	if err != nil {
		return -1, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if e.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.apiKey)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			return -1, err // a certificate does not get better by retrying
		}
		return 0, err
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		serr := &StatusError{StatusCode: resp.StatusCode, Message: errorMessage(raw)}
		if !serr.SafeToRetry() {
			return -1, serr
		}
		return retryAfter(resp.Header, time.Now()), serr
	}
	// A generous bound on the size of n vectors as JSON text, so that a
	// misbehaving server cannot exhaust memory.
	limit := int64(1<<20) + int64(n)*int64(e.dim)*64
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, fmt.Errorf("read response: %w", err)
	}
	if int64(len(raw)) > limit {
		return -1, fmt.Errorf("response larger than %d bytes", limit)
	}
	if err := decodeResponse(raw, n, dst); err != nil {
		return -1, err
	}
	return 0, nil
}

type embeddingResponse struct {
	Data []struct {
		Index     *int      `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
}

// decodeResponse writes the n vectors of an embeddings response, in the
// order of their index and L2-normalised, into dst (n vectors of equal
// length, back to back).
func decodeResponse(raw []byte, n int, dst []float32) error {
	var resp embeddingResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	if len(resp.Data) != n {
		return fmt.Errorf("the response has %d embeddings for %d texts", len(resp.Data), n)
	}
	if n == 0 {
		return nil
	}
	dim := len(dst) / n
	seen := make([]bool, n)
	for _, d := range resp.Data {
		if d.Index == nil {
			return errors.New("an embedding in the response has no index")
		}
		i := *d.Index
		if i < 0 || i >= n {
			return fmt.Errorf("the response has an embedding of index %d for %d texts", i, n)
		}
		if seen[i] {
			return fmt.Errorf("the response has two embeddings of index %d", i)
		}
		seen[i] = true
		if len(d.Embedding) != dim {
			return &DimensionError{Got: len(d.Embedding), Want: dim}
		}
		var sum float64
		for _, x := range d.Embedding {
			sum += float64(x) * float64(x)
		}
		if sum == 0 || math.IsInf(sum, 0) || math.IsNaN(sum) {
			return fmt.Errorf("the embedding of index %d has no direction (norm %g)", i, math.Sqrt(sum))
		}
		norm := math.Sqrt(sum)
		v := dst[i*dim : (i+1)*dim]
		for j, x := range d.Embedding {
			v[j] = float32(float64(x) / norm)
		}
	}
	return nil
}

// errorMessage is the message of an error body: the "message" of an OpenAI
// error ({"error":{"message":...}}), or of the other shapes compatible
// servers use ({"error":"..."}, {"message":"..."}), else the text itself;
// truncated to maxErrorMessage bytes.
func errorMessage(raw []byte) string {
	var body struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	msg := ""
	if json.Unmarshal(raw, &body) == nil {
		var nested struct {
			Message string `json:"message"`
		}
		var flat string
		switch {
		case json.Unmarshal(body.Error, &nested) == nil && nested.Message != "":
			msg = nested.Message
		case json.Unmarshal(body.Error, &flat) == nil && flat != "":
			msg = flat
		case body.Message != "":
			msg = body.Message
		}
	}
	if msg == "" {
		msg = string(raw)
	}
	msg = strings.Join(strings.Fields(strings.ToValidUTF8(msg, "\uFFFD")), " ")
	if len(msg) <= maxErrorMessage {
		return msg
	}
	cut := maxErrorMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// retryAfter is how long the server asks to wait: "retry-after-ms"
// (milliseconds, as OpenAI sends) or "Retry-After" (seconds or an HTTP
// date); 0 when it does not say.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < math.MaxInt64/float64(time.Millisecond) {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && s < math.MaxInt64/float64(time.Second) {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
