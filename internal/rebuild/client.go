package rebuild

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/httpjson"
)

// Client asks a projector process for rebuilds over HTTP or HTTPS, at its
// metrics address ([AdminPath], served by [Manager.Routes]).
type Client struct {
	// Addr is host:port (plain HTTP) or an http:// or https:// URL.
	Addr string
	// HTTP defaults to a client with a 30-second timeout: each request
	// answers at once, a rebuild is followed by polling. Its transport
	// trusts the CA of an https:// Addr's certificate.
	HTTP *http.Client
	// Token is sent as a bearer token (the admin scope); empty: none. It
	// is refused over plain HTTP beyond loopback unless InsecurePlainHTTP.
	Token             string
	InsecurePlainHTTP bool
}

// APIError is an answer of the admin API other than 200 or 202.
type APIError struct {
	URL        string
	StatusCode int
	Code       string // "rebuild_unavailable", "invalid_partition"; "" when the body was no error of the API
	Message    string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("projector at %s: %d %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	}
	return fmt.Sprintf("projector at %s: %s: %s", e.URL, e.Code, e.Message)
}

// Start starts a rebuild of the whole store, or joins the one in
// progress: started says which.
func (c *Client) Start(ctx context.Context) (st Status, started bool, err error) {
	st, code, err := c.do(ctx, http.MethodPost, nil)
	return st, code == http.StatusAccepted, err
}

// StartPartition starts a rebuild of partition part alone, or joins the
// rebuild in progress (of the whole or of another partition; its status
// says which): started says which.
func (c *Client) StartPartition(ctx context.Context, part int) (st Status, started bool, err error) {
	st, code, err := c.do(ctx, http.MethodPost, url.Values{"partition": {strconv.Itoa(part)}})
	return st, code == http.StatusAccepted, err
}

// Status reports the rebuild in progress, or the last one.
func (c *Client) Status(ctx context.Context) (Status, error) {
	st, _, err := c.do(ctx, http.MethodGet, nil)
	return st, err
}

// Wait polls the status of rebuild id every interval until it is done,
// calling progress, if not nil, with each status read or error met. A
// failed poll is asked again (the projector may be restarting: it resumes
// the rebuild); a projector that restarted with no rebuild state left has
// finished it, since that state is deleted last. Another rebuild reported
// in its place is an error.
func (c *Client) Wait(ctx context.Context, id string, interval time.Duration, progress func(Status, error)) (Status, error) {
	if progress == nil {
		progress = func(Status, error) {}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var st Status
	for {
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("stopped waiting for rebuild %s (it goes on in the projector; see GET %s): %w", id, c.adminURL(), ctx.Err())
		case <-t.C:
		}
		next, err := c.Status(ctx)
		if err != nil {
			if ctx.Err() == nil {
				progress(st, err)
			}
			continue
		}
		st = next
		if st.Phase == PhaseStarting {
			continue
		}
		if st.ID != id && st.ID != "" {
			return st, fmt.Errorf("the projector reports rebuild %s, not %s", st.ID, id)
		}
		if st.Phase == PhaseIdle && st.ID == "" {
			st.ID, st.Phase = id, PhaseDone
		}
		progress(st, nil)
		if st.Phase == PhaseDone {
			return st, nil
		}
	}
}

// adminURL is where the rebuild's status is read, for people.
func (c *Client) adminURL() string {
	u, err := auth.BaseURL(c.Addr)
	if err != nil {
		return c.Addr + AdminPath
	}
	return u.JoinPath(AdminPath).String()
}

func (c *Client) do(ctx context.Context, method string, query url.Values) (Status, int, error) {
	var st Status
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	u, err := auth.Endpoint{Addr: c.Addr, Token: c.Token, InsecurePlainHTTP: c.InsecurePlainHTTP}.URL(AdminPath, query)
	if err != nil {
		return st, 0, fmt.Errorf("projector: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, http.NoBody)
	if err != nil {
		return st, 0, err
	}
	auth.SetBearer(req.Header, c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return st, 0, fmt.Errorf("projector at %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }() // httpjson.Read closes it too; this covers a panic
	var se *httpjson.StatusError
	if err := httpjson.Read(resp, 1<<20, &st, http.StatusOK, http.StatusAccepted); errors.As(err, &se) {
		return st, resp.StatusCode, &APIError{URL: u, StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
	} else if err != nil {
		return st, resp.StatusCode, fmt.Errorf("projector at %s: status: %w", u, err)
	}
	return st, resp.StatusCode, nil
}
