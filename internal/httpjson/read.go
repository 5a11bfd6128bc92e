package httpjson

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// StatusError is an answer of an API with a status other than the ones
// the caller accepts: the status, and the code and message of its error
// body (Code "" and the body's start as Message when the body was not the
// APIs' error shape, a proxy's page say).
type StatusError struct {
	StatusCode int
	Code       string
	Message    string
}

func (e *StatusError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("%d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
	}
	return fmt.Sprintf("%d %s: %s (%s)", e.StatusCode, http.StatusText(e.StatusCode), e.Message, e.Code)
}

// ErrUnreadable wraps an answer that could not be read or decoded.
var ErrUnreadable = errors.New("unreadable answer")

// Read reads the answer resp (at most limit bytes of its body) and closes
// its body. An answer with one of the ok statuses (200 when none is
// given) is decoded into out, unless out is nil; any other is a
// *StatusError.
func Read(resp *http.Response, limit int64, out any, ok ...int) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	if len(ok) == 0 {
		ok = []int{http.StatusOK}
	}
	accepted := false
	for _, s := range ok {
		accepted = accepted || resp.StatusCode == s
	}
	if !accepted {
		e := &StatusError{StatusCode: resp.StatusCode, Message: strings.TrimSpace(string(body[:min(len(body), 512)]))}
		var answer struct {
			Error ErrorBody `json:"error"`
		}
		if json.Unmarshal(body, &answer) == nil && answer.Error.Code != "" {
			e.Code, e.Message = answer.Error.Code, answer.Error.Message
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return nil
}

// ErrNoAnswer wraps a request that got no answer (refused, timed out).
var ErrNoAnswer = errors.New("no answer")

// Get GETs rawURL with hc (nil: a client with a 30-second timeout),
// sending token as a bearer token unless it is empty, and reads the
// answer with [Read] into out. A request that gets no answer is wrapped in
// ErrNoAnswer; an answer other than 200 is a *StatusError.
func Get(ctx context.Context, hc *http.Client, rawURL, token string, limit int64, out any) error {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return Read(resp, limit, out)
}
