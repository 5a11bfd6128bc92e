package index

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
)

// SearchPath is where the index projector serves [SearchHandler].
const SearchPath = "/v1/search"

// SearchResponse is the answer of GET /v1/search.
type SearchResponse struct {
	Results []SearchResult `json:"results"`
}

// Client searches the index through the index projector over HTTP or
// HTTPS, at its metrics address: the query is embedded there, with the
// index's own embedder.
type Client struct {
	// Addr is host:port (plain HTTP) or an http:// or https:// URL.
	Addr string
	// HTTP defaults to a client with a 30-second timeout. Its transport
	// trusts the CA of an https:// Addr's certificate.
	HTTP *http.Client
	// Token is sent as a bearer token (the read scope); empty: none. It
	// is refused over plain HTTP beyond loopback unless InsecurePlainHTTP.
	Token             string
	InsecurePlainHTTP bool
	// After are writes (what the writer answered) that each search waits
	// for the index to hold, at most Wait (0: the server's 5s): read your
	// writes. A search the wait outlasts fails with the APIError code
	// not_yet_applied, naming how far the index is.
	After []atleast.Write
	Wait  time.Duration
}

// APIError is an answer of the search API other than 200.
type APIError struct {
	Addr       string
	StatusCode int
	Code       string // "missing_query", "invalid_k", "search_failed", "not_yet_applied"; "" when the body was no error of the API
	Message    string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("the index projector at %s: %d %s: %s", e.Addr, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
	}
	return fmt.Sprintf("the index projector at %s: %d %s: %s (%s)", e.Addr, e.StatusCode, http.StatusText(e.StatusCode), e.Message, e.Code)
}

// Search returns the k chunks nearest to query (1 <= k <= [MaxSearchK]),
// nearest first.
func (c *Client) Search(ctx context.Context, query string, k int) (SearchResponse, error) {
	var out SearchResponse
	q := url.Values{"q": {query}, "k": {strconv.Itoa(k)}}
	atleast.Query(q, c.Wait, c.After...)
	return out, c.get(ctx, SearchPath, q, &out)
}

// Info describes the live generation and its embedder ([InfoPath]).
func (c *Client) Info(ctx context.Context) (Info, error) {
	var out Info
	return out, c.get(ctx, InfoPath, nil, &out)
}

func (c *Client) get(ctx context.Context, path string, q url.Values, out any) error {
	u, err := auth.Endpoint{Addr: c.Addr, Token: c.Token, InsecurePlainHTTP: c.InsecurePlainHTTP}.URL(path, q)
	if err != nil {
		return fmt.Errorf("the index projector: %w", err)
	}
	err = httpjson.Get(ctx, c.HTTP, u, c.Token, 64<<20, out)
	var se *httpjson.StatusError
	switch {
	case errors.As(err, &se):
		return &APIError{Addr: c.Addr, StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
	case errors.Is(err, httpjson.ErrNoAnswer):
		return fmt.Errorf("the index projector at %s does not answer: %w", c.Addr, err)
	case err != nil:
		return fmt.Errorf("the index projector at %s: %w", c.Addr, err)
	}
	return nil
}
