package writer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

// ReemitPath is where the writer serves re-emissions.
const ReemitPath = "/v1/admin/reemit"

// Client calls the writer's HTTP API; today its re-emission endpoint,
// POST /v1/admin/reemit.
type Client struct {
	// Token is sent as a bearer token; re-emission needs one with the
	// admin scope when the writer has a tokens file. Empty: none is sent.
	Token string
	base  string
	http  *http.Client
}

// NewClient returns a client of the writer at baseURL (http://host:port
// or https://...). hc nil is a client with a 5-minute timeout: a page of a
// re-emission is one transaction of up to [MaxReemitKeys] documents.
func NewClient(baseURL string, hc *http.Client) (*Client, error) {
	base := strings.TrimRight(strings.TrimSpace(baseURL), "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("writer: the URL must be http://host:port or https://..., got %q", baseURL)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Minute}
	}
	return &Client{base: base, http: hc}, nil
}

// URL is the writer's base URL.
func (c *Client) URL() string { return c.base }

// APIError is an error answer of the writer: its status and the code of
// its {"error":{"code","message"}} body. It matches, with errors.Is, the
// error of the store the code stands for: [docstore.ErrVersionConflict],
// [docstore.ErrNotFound], [docstore.ErrNotReproducible], or
// [contract.ErrInvalid] for a request the writer found malformed or too
// large.
type APIError struct {
	StatusCode int
	Code       string // "" when the body was no error of the API
	Message    string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("the writer answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
	}
	return fmt.Sprintf("the writer refused the request: %s (%s)", e.Message, e.Code)
}

// Is classifies e by its code; see [APIError].
func (e *APIError) Is(target error) bool {
	switch target {
	case docstore.ErrVersionConflict:
		return e.Code == "version_conflict"
	case docstore.ErrNotFound:
		return e.Code == "not_found"
	case docstore.ErrNotReproducible:
		return e.Code == "not_reproducible"
	case contract.ErrInvalid:
		return e.Invalid()
	}
	return false
}

// Invalid reports whether the writer refused the request itself (400,
// 413, 415, 422): sending it again changes nothing.
func (e *APIError) Invalid() bool {
	switch e.StatusCode {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return e.Code != ""
	}
	return false
}

// TooLarge reports whether the request was above a size limit (413).
func (e *APIError) TooLarge() bool { return e.StatusCode == http.StatusRequestEntityTooLarge }

// SafeToRetry reports whether the writer wrote nothing because its store
// was unavailable (503): the same request may be sent again later.
func (e *APIError) SafeToRetry() bool { return e.StatusCode == http.StatusServiceUnavailable }

// Reemit sends one re-emission request.
func (c *Client) Reemit(ctx context.Context, req ReemitRequest) (ReemitResponse, error) {
	var out ReemitResponse
	err := c.post(ctx, ReemitPath, req, &out)
	return out, err
}

// ReemitKeys re-emits keys, in requests of at most [MaxReemitKeys]. On an
// error, the answer holds the requests answered before it.
func (c *Client) ReemitKeys(ctx context.Context, keys []string) (ReemitResponse, error) {
	res, err := c.producer().Reemit(ctx, keys)
	return fromProducer(res), fromProducerError(err)
}

// ReemitAll re-emits every document after the key after (exclusive), in
// key order, limit documents per request, calling page with each answer.
// On an error or when ctx ends, it returns the key to resume after: the
// After of the request that was not answered.
func (c *Client) ReemitAll(ctx context.Context, after string, limit int, page func(ReemitResponse)) (resume string, err error) {
	resume, err = c.producer().ReemitAll(ctx, after, limit, func(r client.Reemitted) {
		if page != nil {
			page(fromProducer(r))
		}
	})
	return resume, fromProducerError(err)
}

// producer is the producers' client (pkg/client) over c's connection and
// token, sending each request once: the callers decide about retries.
func (c *Client) producer() *client.Client {
	pc, err := client.New(c.base, client.WithHTTPClient(c.http), client.WithToken(c.Token), client.WithRetry(client.Retry{Attempts: 1}))
	if err != nil {
		panic(err) // c.base was checked by NewClient
	}
	return pc
}

// fromProducer is r in this package's types.
func fromProducer(r client.Reemitted) ReemitResponse {
	out := ReemitResponse{Reemitted: make([]ReemittedDocument, 0, len(r.Reemitted)), NotFound: r.NotFound, Next: r.Next}
	if out.NotFound == nil {
		out.NotFound = []string{}
	}
	for _, d := range r.Reemitted {
		id, _ := uuid.Parse(d.EventID) // the writer's own answer: a uuid
		out.Reemitted = append(out.Reemitted, ReemittedDocument{Key: d.Key, Version: d.Version, EventID: id, Emission: d.Emission})
	}
	return out
}

// fromProducerError makes the producers' client's error answer an
// [*APIError]; other errors (no answer) stay as they are.
func fromProducerError(err error) error {
	var e *client.Error
	if errors.As(err, &e) {
		return &APIError{StatusCode: e.StatusCode, Code: e.Code, Message: e.Message}
	}
	return err
}

func (c *Client) post(ctx context.Context, path string, body, v any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	auth.SetBearer(req.Header, c.Token)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("the writer at %s does not answer: %w", c.base, err)
	}
	defer func() { _ = resp.Body.Close() }() // httpjson.Read closes it too; this covers a panic
	var se *httpjson.StatusError
	if err := httpjson.Read(resp, 256<<20, v); errors.As(err, &se) {
		return &APIError{StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
	} else if err != nil {
		return fmt.Errorf("the writer's answer: %w", err)
	}
	return nil
}
