// Package client is the Go client of converge's writer, for producers:
// store, withdraw and read documents, stream batches, re-emit events.
//
// Every write names its version, so sending one again is safe: the same
// content is answered "unchanged", an older version "stale", and only the
// same version with other content is an error ([ErrVersionConflict]). The
// client therefore retries, with backoff, each request the writer did not
// answer or answered with 503 (nothing written), and a batch resends the
// lines the writer had not answered.
//
//	c, err := client.New("https://writer.example:8080", client.WithToken(token))
//	res, err := c.Put(ctx, contract.Document{Key: "kb/wal", Version: 3, Title: "WAL", Body: "..."})
//	// res.Result is "applied", "unchanged" or "stale"
//
// The API it speaks is described by api/openapi.json, which the writer
// also serves at /openapi.json.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/pkg/contract"
)

// Client calls one writer. It is safe for concurrent use.
type Client struct {
	base  string
	token string
	http  *http.Client
	retry Retry
	agent string
	tls   *tls.Config
}

// Retry is how often and how patiently a request is sent again after no
// answer or a 503.
type Retry struct {
	// Attempts in all, the first included; 1 sends each request once.
	Attempts int
	// Base is the wait before the first retry; it doubles each time, up
	// to Max, with jitter.
	Base, Max time.Duration
}

// DefaultRetry is 5 attempts, waiting 100ms, 200ms, 400ms and 800ms
// (each ±25%).
var DefaultRetry = Retry{Attempts: 5, Base: 100 * time.Millisecond, Max: 5 * time.Second}

// Option configures a [Client].
type Option func(*Client) error

// WithToken sends token as the bearer token of every request: the writer
// asks one with the write scope of the document routes, the admin scope of
// re-emission, when it has a tokens file.
func WithToken(token string) Option {
	return func(c *Client) error {
		c.token = strings.TrimSpace(token)
		return nil
	}
}

// WithHTTPClient sends the requests with hc (its Transport, timeouts and
// all) instead of the client's own. Combined with [WithTLS] or
// [WithCAFile], hc's Transport must be an *http.Transport.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.http = hc
		return nil
	}
}

// WithTLS speaks TLS with cfg (its RootCAs, client certificates, ...).
func WithTLS(cfg *tls.Config) Option {
	return func(c *Client) error {
		c.tls = cfg.Clone()
		return nil
	}
}

// WithCAFile trusts the PEM certificates of path (the writer's CA, or its
// self-signed certificate) besides the system's.
func WithCAFile(path string) Option {
	return func(c *Client) error {
		pem, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("client: CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("client: CA file %s holds no PEM certificate", path)
		}
		if c.tls == nil {
			c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tls.RootCAs = pool
		return nil
	}
}

// WithRetry replaces [DefaultRetry].
func WithRetry(r Retry) Option {
	return func(c *Client) error {
		if r.Attempts < 1 {
			return fmt.Errorf("client: Retry.Attempts must be at least 1, got %d", r.Attempts)
		}
		c.retry = r
		return nil
	}
}

// WithUserAgent names the producer in the User-Agent of its requests.
func WithUserAgent(agent string) Option {
	return func(c *Client) error {
		c.agent = agent
		return nil
	}
}

// New returns a client of the writer at baseURL (http://host:port or
// https://host:port).
func New(baseURL string, opts ...Option) (*Client, error) {
	base := strings.TrimRight(strings.TrimSpace(baseURL), "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: the writer's URL must be http://host:port or https://host:port, got %q", baseURL)
	}
	c := &Client{base: base, retry: DefaultRetry, agent: "converge-client"}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.http == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 16
		c.http = &http.Client{Transport: t}
	}
	if c.tls != nil {
		t, ok := c.http.Transport.(*http.Transport)
		if !ok {
			return nil, errors.New("client: TLS options need the HTTP client's Transport to be an *http.Transport")
		}
		t = t.Clone()
		t.TLSClientConfig = c.tls
		hc := *c.http
		hc.Transport = t
		c.http = &hc
	}
	return c, nil
}

// URL is the writer's base URL.
func (c *Client) URL() string { return c.base }

// Result is the answer to a write: the document's key and version, what
// became of it, and its event's id.
type Result struct {
	Key     string `json:"key"`
	Version int64  `json:"version"`
	// Result is "applied" (stored, its event is in the outbox),
	// "unchanged" (this exact version was already stored) or "stale" (a
	// newer version is stored; nothing written).
	Result  string `json:"result"`
	EventID string `json:"event_id"`
}

// After is the write as the projections' read APIs take it, KEY@VERSION:
// a search (GET /v1/search?after=...) or a graph read (GET
// /v1/graph/{key}?after=...) given it waits until that projection holds
// this version or a newer one (wait= bounds it, 5s by default), and
// answers 503 not_yet_applied, saying how far the projection is, if it
// does not within the wait. `converge search -after` and `converge graph
// -after` take it too. After a stale write it names the version sent,
// which the projection already passed.
func (r Result) After() string { return r.Key + "@" + strconv.FormatInt(r.Version, 10) }

// Outcomes of a write.
const (
	Applied   = "applied"
	Unchanged = "unchanged"
	Stale     = "stale"
)

// Record is a document as the writer stored it.
type Record struct {
	Key         string          `json:"key"`
	Version     int64           `json:"version"`
	Withdrawn   bool            `json:"withdrawn"`
	Title       string          `json:"title"`
	Body        string          `json:"body"`
	Links       []string        `json:"links"`
	Tags        []string        `json:"tags"`
	Meta        json.RawMessage `json:"meta"`
	ContentHash string          `json:"content_hash"`
	Chunks      int             `json:"chunks"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// Put stores doc at doc.Version.
func (c *Client) Put(ctx context.Context, doc contract.Document) (Result, error) {
	if err := checkKey(doc.Key); err != nil {
		return Result{}, err
	}
	// A batch line without its key: the key is the path's.
	body, err := json.Marshal(wireLine{Version: doc.Version, Title: doc.Title, Body: doc.Body, Links: doc.Links, Tags: doc.Tags, Meta: doc.Meta})
	if err != nil {
		return Result{}, fmt.Errorf("client: encode %q: %w", doc.Key, err)
	}
	var res Result
	err = c.do(ctx, http.MethodPut, documentPath(doc.Key), "application/json", body, &res)
	return res, err
}

// Delete withdraws key at version: a tombstone, which no older version can
// bring back.
func (c *Client) Delete(ctx context.Context, key string, version int64) (Result, error) {
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	var res Result
	err := c.do(ctx, http.MethodDelete, documentPath(key)+"?version="+strconv.FormatInt(version, 10), "", nil, &res)
	return res, err
}

// Get returns key's current record, tombstone or not; [ErrNotFound] when
// no version of it was ever written.
func (c *Client) Get(ctx context.Context, key string) (Record, error) {
	if err := checkKey(key); err != nil {
		return Record{}, err
	}
	var rec Record
	err := c.do(ctx, http.MethodGet, documentPath(key), "", nil, &rec)
	return rec, err
}

// checkKey refuses, before any request, a key the writer would refuse:
// an [*Error] of status 0 with the writer's code.
func checkKey(key string) error {
	var ve *contract.ValidationError
	if err := contract.ValidateKey(key); errors.As(err, &ve) {
		return &Error{Code: ve.Code, Message: ve.Error()}
	}
	return nil
}

// documentPath escapes key into the path; keys of dots only are written
// with %2E, which clients and routers would otherwise take for . and ..
// segments.
func documentPath(key string) string {
	esc := url.PathEscape(key)
	if strings.Trim(key, ".") == "" {
		esc = strings.Repeat("%2E", len(key))
	}
	return "/v1/documents/" + esc
}

// do sends a request with retries and decodes a 200's body into out.
func (c *Client) do(ctx context.Context, method, path, ctype string, body []byte, out any) error {
	return c.withRetry(ctx, func() error {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
		if err != nil {
			return err
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		c.authorize(req)
		resp, err := c.http.Do(req)
		if err != nil {
			return &transportError{base: c.base, err: err}
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return readError(resp)
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(out); err != nil {
			return fmt.Errorf("client: the writer's answer to %s %s: %w", method, path, err)
		}
		return nil
	})
}

// maxAnswerBytes bounds an answer read: a record with the largest body,
// JSON-escaped.
const maxAnswerBytes = 64 << 20

func (c *Client) authorize(req *http.Request) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.agent)
}

// withRetry runs f until it succeeds, fails for good, or the attempts or
// ctx run out.
func (c *Client) withRetry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = f()
		if err == nil || !retryable(err) || attempt >= c.retry.Attempts || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(c.backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
	return err
}

// backoff is the wait before retry n (1, 2, ...).
func (c *Client) backoff(n int) time.Duration {
	d := c.retry.Base << (n - 1)
	if d <= 0 || (c.retry.Max > 0 && d > c.retry.Max) {
		d = c.retry.Max
	}
	return time.Duration(float64(d) * (0.75 + rand.Float64()/2)) //nolint:gosec // jitter, not a secret
}

// readError reads an error answer.
func readError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var b struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		// A projector's not_yet_applied answer names the writes it does
		// not hold yet.
		Behind   []PendingWrite `json:"behind"`
		WaitedMS *int64         `json:"waited_ms"`
	}
	if json.Unmarshal(data, &b) == nil && b.Error != nil && b.Error.Code != "" {
		e := &Error{StatusCode: resp.StatusCode, Code: b.Error.Code, Message: b.Error.Message}
		if b.WaitedMS != nil {
			e.notYet = &notYetData{pending: b.Behind, waited: time.Duration(*b.WaitedMS) * time.Millisecond}
		}
		return e
	}
	msg := strings.TrimSpace(string(data))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return &Error{StatusCode: resp.StatusCode, Message: msg}
}

// Document is what a producer writes: [contract.Document].
type Document = contract.Document
