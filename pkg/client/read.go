package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Codes of the projectors' read APIs' error answers, besides those the
// writer shares with them ([CodeUnauthorized], [CodeForbidden],
// [CodeNotFound], [CodeMissingKey], [CodeUnavailable]).
const (
	// CodeNotYetApplied: the wait of a read with [After] ended before the
	// projection held every write it names (503); a [*NotYetAppliedError].
	CodeNotYetApplied    = "not_yet_applied"
	CodeMissingQuery     = "missing_query"
	CodeInvalidK         = "invalid_k"
	CodeInvalidAfter     = "invalid_after"
	CodeInvalidWait      = "invalid_wait"
	CodeSearchFailed     = "search_failed"
	CodeGraphUnavailable = "graph_unavailable"
)

// ErrNotYetApplied matches a [*NotYetAppliedError] with errors.Is.
var ErrNotYetApplied = errors.New("client: the projection has not applied the writes yet")

// Bounds of the read APIs, checked before sending.
const (
	maxSearchK   = 1000             // k of a search
	maxAfter     = 100              // writes one read may name
	maxWait      = time.Minute      // a read's wait
	searchPath   = "/v1/search"     // the index projector's
	graphPrefix  = "/v1/graph/"     // the graph projector's, then the key
	paramAfter   = "after"          // KEY@VERSION, repeated
	paramWait    = "wait"           // a Go duration
	notYetPrefix = "after waiting " // of a not_yet_applied message
)

// Reader reads a projection through its projector's read API: the index
// projector's search (GET /v1/search) or the graph projector's documents
// (GET /v1/graph/{key}), both served on the projector's metrics address
// (127.0.0.1:9103 and 127.0.0.1:9104 by default). It is safe for
// concurrent use.
//
// A read given [After] the writer's answer to a write waits until the
// projection holds that version of the document or a newer one: a
// producer reads its own writes. It is retried, as the writer's requests
// are ([WithRetry]), when the projector does not answer; a
// [*NotYetAppliedError] is not retried.
type Reader struct {
	c *Client
}

// NewReader returns a reader of the projector at baseURL (http://host:port
// or https://host:port). It takes the writer client's options; the token
// of [WithToken] needs the read scope.
func NewReader(baseURL string, opts ...Option) (*Reader, error) {
	base := strings.TrimRight(strings.TrimSpace(baseURL), "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: the projector's URL must be http://host:port or https://host:port, got %q", baseURL)
	}
	c, err := New(base, opts...)
	if err != nil {
		return nil, err
	}
	return &Reader{c: c}, nil
}

// URL is the projector's base URL.
func (r *Reader) URL() string { return r.c.base }

// ReadOption qualifies one read: [After], [AfterWrite], [Wait].
type ReadOption func(*readOptions)

type readOptions struct {
	after   []string // KEY@VERSION
	invalid []string // what After was given that is no write
	wait    time.Duration
	hasWait bool
}

// After makes the read wait until the projection holds each result's
// document at the result's version or a newer one ([Result.After]).
func After(results ...Result) ReadOption {
	return func(o *readOptions) {
		for _, r := range results {
			o.add(r.Key, r.Version)
		}
	}
}

// AfterWrite is [After] for a write known by its key and version (a
// document inserted in SQL, say).
func AfterWrite(key string, version int64) ReadOption {
	return func(o *readOptions) { o.add(key, version) }
}

func (o *readOptions) add(key string, version int64) {
	w := Result{Key: key, Version: version}.After()
	if key == "" || version < 1 {
		o.invalid = append(o.invalid, w)
		return
	}
	for _, have := range o.after {
		if have == w {
			return
		}
	}
	o.after = append(o.after, w)
}

// Wait bounds how long a read with [After] waits for the projection,
// instead of the projector's default of 5s; at most 1 minute. Wait(0)
// answers at once, with a [*NotYetAppliedError] if the projection does
// not hold the writes yet. Without After it has no effect.
func Wait(d time.Duration) ReadOption {
	return func(o *readOptions) { o.wait, o.hasWait = d, true }
}

// readQuery adds the options' parameters to q, or refuses them before
// sending as the projector would (an [*Error] of status 0).
func readQuery(q url.Values, opts []ReadOption) error {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case len(o.invalid) > 0:
		return &Error{Code: CodeInvalidAfter, Message: fmt.Sprintf("after %q: a write needs a key and a version from 1", o.invalid[0])}
	case len(o.after) > maxAfter:
		return &Error{Code: CodeInvalidAfter, Message: fmt.Sprintf("a read waits for at most %d writes, got %d", maxAfter, len(o.after))}
	case o.hasWait && (o.wait < 0 || o.wait > maxWait):
		return &Error{Code: CodeInvalidWait, Message: fmt.Sprintf("wait must be from 0 to %v, got %v", maxWait, o.wait)}
	}
	for _, w := range o.after {
		q.Add(paramAfter, w)
	}
	if o.hasWait && len(o.after) > 0 {
		q.Set(paramWait, o.wait.String())
	}
	return nil
}

// Hit is one chunk a search found.
type Hit struct {
	Key     string   `json:"key"`
	Version int64    `json:"version"` // the version the index holds
	Ordinal int      `json:"ordinal"` // the chunk's position in the document, from 0
	ChunkID string   `json:"chunk_id"`
	Title   string   `json:"title"`
	Tags    []string `json:"tags"`
	Score   float32  `json:"score"` // higher is nearer
	Text    string   `json:"text"`
}

// Search returns the k chunks nearest to query (k from 1 to 1000; 0: the
// projector's 10), nearest first, from the index projector. The query is
// embedded there, with the index's own embedder.
func (r *Reader) Search(ctx context.Context, query string, k int, opts ...ReadOption) ([]Hit, error) {
	switch {
	case query == "":
		return nil, &Error{Code: CodeMissingQuery, Message: "the query must not be empty"}
	case k < 0 || k > maxSearchK:
		return nil, &Error{Code: CodeInvalidK, Message: fmt.Sprintf("k must be from 1 to %d, got %d", maxSearchK, k)}
	}
	q := url.Values{"q": {query}}
	if k > 0 {
		q.Set("k", strconv.Itoa(k))
	}
	if err := readQuery(q, opts); err != nil {
		return nil, err
	}
	var out struct {
		Results []Hit `json:"results"`
	}
	if err := r.get(ctx, searchPath, q, &out); err != nil {
		return nil, err
	}
	return out.Results, nil
}

// GraphDocument is what the graph holds about a document.
type GraphDocument struct {
	Key string `json:"key"`
	// Stub is a node only linked to: no version of it was applied.
	Stub    bool  `json:"stub"`
	Version int64 `json:"version"`
	// Deleted is a withdrawn document's node, kept with its version.
	Deleted     bool         `json:"deleted"`
	Title       string       `json:"title"`
	ContentHash string       `json:"content_hash"`
	Chunks      []GraphChunk `json:"chunks"`
	LinksOut    []string     `json:"links_out"` // the keys it links to
	LinksIn     []string     `json:"links_in"`  // the keys linking to it
	Tags        []string     `json:"tags"`
}

// GraphChunk is a chunk of a [GraphDocument].
type GraphChunk struct {
	ID          string `json:"id"`
	Ordinal     int    `json:"ordinal"`
	ContentHash string `json:"content_hash"`
}

// Graph returns what the graph projector holds about the document key;
// [ErrNotFound] when the graph has no node of it.
func (r *Reader) Graph(ctx context.Context, key string, opts ...ReadOption) (GraphDocument, error) {
	if err := checkKey(key); err != nil {
		return GraphDocument{}, err
	}
	q := url.Values{}
	if err := readQuery(q, opts); err != nil {
		return GraphDocument{}, err
	}
	// The whole key in one escaped segment, as the writer's paths: its
	// slashes, dots and "?" stay the key's.
	esc := url.PathEscape(key)
	if strings.Trim(key, ".") == "" {
		esc = strings.Repeat("%2E", len(key))
	}
	var doc GraphDocument
	err := r.get(ctx, graphPrefix+esc, q, &doc)
	return doc, err
}

// get sends a GET with retries and decodes a 200's body into out.
func (r *Reader) get(ctx context.Context, path string, q url.Values, out any) error {
	target := r.c.base + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	writes := q[paramAfter]
	return r.c.withRetry(ctx, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return err
		}
		r.c.authorize(req)
		resp, err := r.c.http.Do(req)
		if err != nil {
			return &projectorError{base: r.c.base, err: &transportError{base: r.c.base, err: err}}
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err := readError(resp)
			var e *Error
			if errors.As(err, &e) && e.Code == CodeNotYetApplied {
				return newNotYetApplied(r.c.base, e, writes)
			}
			return &projectorError{base: r.c.base, err: err}
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(out); err != nil {
			return fmt.Errorf("client: the projector's answer to GET %s: %w", path, err)
		}
		return nil
	})
}

// projectorError is an error answer of a projector, an [*Error], or no
// answer, named as the projector's.
type projectorError struct {
	base string
	err  error
}

func (e *projectorError) Error() string {
	var ae *Error
	var te *transportError
	switch {
	case errors.As(e.err, &ae) && ae.Code == "":
		return fmt.Sprintf("the projector at %s answered %d %s: %s", e.base, ae.StatusCode, http.StatusText(ae.StatusCode), ae.Message)
	case errors.As(e.err, &ae):
		return fmt.Sprintf("the projector at %s answered %d %s: %s (%s)", e.base, ae.StatusCode, http.StatusText(ae.StatusCode), ae.Message, ae.Code)
	case errors.As(e.err, &te):
		return fmt.Sprintf("the projector at %s does not answer: %v", e.base, te.err)
	}
	return fmt.Sprintf("the projector at %s: %v", e.base, e.err)
}

func (e *projectorError) Unwrap() error { return e.err }

// NotYetAppliedError is a read with [After] whose wait ended before the
// projection held every write it names (503 not_yet_applied): nothing was
// read. Reading again later, or with a longer [Wait], may succeed.
type NotYetAppliedError struct {
	// Pending are the writes the projection did not hold, each with the
	// version it held instead; empty when the projector's message could
	// not be read (Err.Message has it all).
	Pending []PendingWrite
	// Waited is how long the projector waited; 0 when its message does
	// not say.
	Waited time.Duration
	// Err is the answer: status 503, [CodeNotYetApplied], the projector's
	// message.
	Err  *Error
	base string
}

// PendingWrite is a write a projection did not hold yet.
type PendingWrite struct {
	Key     string `json:"key"`
	Version int64  `json:"version"` // the version the read asked for
	Holds   int64  `json:"holds"`   // the version the projection held; 0: none
}

func (e *NotYetAppliedError) Error() string {
	return fmt.Sprintf("the projector at %s: %s (%s)", e.base, e.Err.Message, e.Err.Code)
}

// Unwrap is the answer, an [*Error].
func (e *NotYetAppliedError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotYetApplied) true.
func (e *NotYetAppliedError) Is(target error) bool { return target == ErrNotYetApplied }

// newNotYetApplied takes the writes not held from the answer's behind
// list, or, from a projector that sent none, reads its message, "after waiting 50ms the
// projection has not applied 2 of the writes asked for: a@2 (it holds
// version 1), b@1 (it holds no version)". Its list is read against the
// writes asked for (keys may hold ", " or "@").
func newNotYetApplied(base string, e *Error, asked []string) *NotYetAppliedError {
	err := &NotYetAppliedError{Err: e, base: base}
	if e.notYet != nil {
		// The answer's data (projectors from this version on).
		err.Pending, err.Waited = e.notYet.pending, e.notYet.waited
		return err
	}
	msg := e.Message
	if rest, ok := strings.CutPrefix(msg, notYetPrefix); ok {
		if d, _, ok := strings.Cut(rest, " "); ok {
			err.Waited, _ = time.ParseDuration(d)
		}
	}
	_, list, ok := strings.Cut(msg, " of the writes asked for: ")
	if !ok {
		return err
	}
	var pending []PendingWrite
	for list != "" {
		// The longest write asked for that starts the list's next item.
		var w string
		for _, a := range asked {
			if len(a) > len(w) && strings.HasPrefix(list, a+" (it holds ") {
				w = a
			}
		}
		if w == "" {
			return err
		}
		list = list[len(w)+len(" (it holds "):]
		var holds int64
		switch {
		case strings.HasPrefix(list, "no version)"):
			list = list[len("no version)"):]
		case strings.HasPrefix(list, "version "):
			num, rest, ok := strings.Cut(list[len("version "):], ")")
			v, perr := strconv.ParseInt(num, 10, 64)
			if !ok || perr != nil {
				return err
			}
			holds, list = v, rest
		default:
			return err
		}
		i := strings.LastIndexByte(w, '@')
		version, _ := strconv.ParseInt(w[i+1:], 10, 64)
		pending = append(pending, PendingWrite{Key: w[:i], Version: version, Holds: holds})
		if list != "" {
			if list, ok = strings.CutPrefix(list, ", "); !ok {
				return err
			}
		}
	}
	err.Pending = pending
	return err
}
