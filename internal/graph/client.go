package graph

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
)

// DocumentPath is the prefix of the path of GET /v1/graph/{key}, served by
// [DocumentHandler].
const DocumentPath = "/v1/graph/"

// ErrNoDocument is matched by the [*APIError] of a document the graph has
// no node for.
var ErrNoDocument = errors.New("graph: no such document")

// Client reads what the graph holds about documents through the graph
// projector over HTTP or HTTPS, at its metrics address.
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
	// After are writes (what the writer answered) that each read waits
	// for the graph to hold, at most Wait (0: the server's 5s): read your
	// writes. A read the wait outlasts fails with the APIError code
	// not_yet_applied, naming how far the graph is.
	After []atleast.Write
	Wait  time.Duration
}

// APIError is an answer of the graph's read API other than 200.
type APIError struct {
	Addr       string
	StatusCode int
	Code       string // "not_found", "missing_key", "graph_unavailable", "not_yet_applied"; "" when the body was no error of the API
	Message    string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("the graph projector at %s: %d %s: %s", e.Addr, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
	}
	return fmt.Sprintf("the graph projector at %s: %d %s: %s (%s)", e.Addr, e.StatusCode, http.StatusText(e.StatusCode), e.Message, e.Code)
}

// Is makes errors.Is(err, ErrNoDocument) true for a 404 not_found.
func (e *APIError) Is(target error) bool {
	return target == ErrNoDocument && e.StatusCode == http.StatusNotFound && e.Code == "not_found"
}

// Document returns what the graph holds about the document key: its node
// (a stub when it is only linked to), chunks, links out and in, and tags.
func (c *Client) Document(ctx context.Context, key string) (DocumentJSON, error) {
	var out DocumentJSON
	q := url.Values{}
	atleast.Query(q, c.Wait, c.After...)
	base, err := auth.Endpoint{Addr: c.Addr, Token: c.Token, InsecurePlainHTTP: c.InsecurePlainHTTP}.URL(DocumentPath, q)
	if err != nil {
		return out, fmt.Errorf("the graph projector: %w", err)
	}
	// The key is one escaped segment (its slashes as %2F), which the
	// route's {key...} reads back whole: as path separators, "a/../b" or
	// "a//b" would be cleaned and redirected to another document's path.
	pu, err := url.Parse(base)
	if err != nil {
		return out, fmt.Errorf("the graph projector: %w", err)
	}
	esc := url.PathEscape(key)
	if strings.Trim(key, ".") == "" { // "." and "..": a path would drop them
		esc = strings.Repeat("%2E", len(key))
	}
	pu.RawPath = pu.EscapedPath() + esc
	pu.Path += key
	u := pu.String()
	err = httpjson.Get(ctx, c.HTTP, u, c.Token, 64<<20, &out)
	var se *httpjson.StatusError
	switch {
	case errors.As(err, &se):
		return out, &APIError{Addr: c.Addr, StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
	case errors.Is(err, httpjson.ErrNoAnswer):
		return out, fmt.Errorf("the graph projector at %s does not answer: %w", c.Addr, err)
	case err != nil:
		return out, fmt.Errorf("the graph projector at %s: %w", c.Addr, err)
	}
	return out, nil
}
