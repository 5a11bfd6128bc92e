// Package atleast is read-your-writes for the projections' read APIs: a
// read names the writes it must see (after=KEY@VERSION, what the writer
// answered), and is answered only once the projection holds each of those
// documents at that version or a newer one, waiting at most a bound
// (wait=DURATION). When the bound passes first, the answer is 503
// not_yet_applied, naming each write the projection does not hold yet and
// the version it holds instead: how far it is.
//
// The projection is asked again every PollInterval; a read without after=
// is answered at once, as before.
package atleast

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/httpjson"
)

// Query parameters of a read that waits for writes.
const (
	ParamAfter = "after" // KEY@VERSION, repeatable
	ParamWait  = "wait"  // a Go duration, e.g. 2s
)

// Bounds of the wait.
const (
	DefaultWait  = 5 * time.Second
	MaxWait      = time.Minute
	PollInterval = 5 * time.Millisecond
	// MaxWrites bounds the writes one read may name.
	MaxWrites = 100
)

// Write is a document version a read must see.
type Write struct {
	Key     string
	Version int64
}

// String is KEY@VERSION.
func (w Write) String() string { return w.Key + "@" + strconv.FormatInt(w.Version, 10) }

// ParseWrite reads KEY@VERSION (the key may hold @: the last one counts).
func ParseWrite(s string) (Write, error) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 {
		return Write{}, fmt.Errorf("%q is not KEY@VERSION", s)
	}
	v, err := strconv.ParseInt(s[i+1:], 10, 64)
	if err != nil || v < 1 {
		return Write{}, fmt.Errorf("%q: the version must be an integer from 1", s)
	}
	return Write{Key: s[:i], Version: v}, nil
}

// Query is the query parameters that make a read wait for writes, bounded
// by wait (0: the server's default).
func Query(q url.Values, wait time.Duration, writes ...Write) {
	for _, w := range writes {
		q.Add(ParamAfter, w.String())
	}
	if wait > 0 {
		q.Set(ParamWait, wait.String())
	}
}

// Versions reads the versions a projection holds of keys (a withdrawn
// document's tombstone counts); a key it does not hold is absent.
type Versions func(ctx context.Context, keys []string) (map[string]int64, error)

// NotYetError is a wait that ended before the projection held every write.
type NotYetError struct {
	Waited time.Duration
	// Behind are the writes not held yet, with the version held instead
	// (0: none).
	Behind []Behind
}

// NotYetBody is the body of a 503 not_yet_applied: the error, and beside
// it the writes the projection does not hold yet, as data.
type NotYetBody struct {
	Error    httpjson.ErrorBody `json:"error"`
	Behind   []BehindJSON       `json:"behind"`
	WaitedMS int64              `json:"waited_ms"`
}

// BehindJSON is a write not held yet: the version asked for, and the
// version held (0: none).
type BehindJSON struct {
	Key     string `json:"key"`
	Version int64  `json:"version"`
	Holds   int64  `json:"holds"`
}

func writeNotYet(w http.ResponseWriter, e *NotYetError) {
	body := NotYetBody{Error: httpjson.ErrorBody{Code: "not_yet_applied", Message: e.Error()}, WaitedMS: e.Waited.Milliseconds(),
		Behind: make([]BehindJSON, len(e.Behind))}
	for i, b := range e.Behind {
		body.Behind[i] = BehindJSON{Key: b.Key, Version: b.Version, Holds: b.Holds}
	}
	httpjson.Write(w, http.StatusServiceUnavailable, body)
}

// Behind is one write a projection does not hold yet.
type Behind struct {
	Write
	Holds int64
}

func (e *NotYetError) Error() string {
	parts := make([]string, len(e.Behind))
	for i, b := range e.Behind {
		holds := "no version"
		if b.Holds > 0 {
			holds = "version " + strconv.FormatInt(b.Holds, 10)
		}
		parts[i] = fmt.Sprintf("%s (it holds %s)", b.Write, holds)
	}
	return fmt.Sprintf("after waiting %v the projection has not applied %d of the writes asked for: %s",
		e.Waited.Round(time.Millisecond), len(e.Behind), strings.Join(parts, ", "))
}

// Wait returns once versions reports each write at its version or a newer
// one, or a *NotYetError after wait, or ctx's error.
func Wait(ctx context.Context, writes []Write, wait time.Duration, versions Versions) error {
	if len(writes) == 0 {
		return nil
	}
	keys := make([]string, len(writes))
	for i, w := range writes {
		keys[i] = w.Key
	}
	start := time.Now()
	deadline := start.Add(wait)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		held, err := versions(ctx, keys)
		if err != nil {
			return err
		}
		var behind []Behind
		for _, w := range writes {
			if held[w.Key] < w.Version {
				behind = append(behind, Behind{Write: w, Holds: held[w.Key]})
			}
		}
		if len(behind) == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return &NotYetError{Waited: time.Since(start), Behind: behind}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Handler is h, answered once the projection holds the writes the
// request's after= parameters name (see the package doc); a bad parameter
// is 400, a wait that ends first 503 not_yet_applied.
func Handler(versions Versions, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		raw := q[ParamAfter]
		if len(raw) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		if len(raw) > MaxWrites {
			httpjson.Error(w, http.StatusBadRequest, "invalid_after", fmt.Sprintf("at most %d after= parameters", MaxWrites))
			return
		}
		writes := make([]Write, 0, len(raw))
		for _, s := range raw {
			wr, err := ParseWrite(s)
			if err != nil {
				httpjson.Error(w, http.StatusBadRequest, "invalid_after", "after: "+err.Error())
				return
			}
			writes = append(writes, wr)
		}
		wait := DefaultWait
		if s := q.Get(ParamWait); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 || d > MaxWait {
				httpjson.Error(w, http.StatusBadRequest, "invalid_wait", fmt.Sprintf("wait must be a duration from 0 to %v, e.g. 2s", MaxWait))
				return
			}
			wait = d
		}
		err := Wait(r.Context(), writes, wait, versions)
		var notYet *NotYetError
		switch {
		case errors.As(err, &notYet):
			w.Header().Set("Retry-After", "1")
			writeNotYet(w, notYet)
			return
		case err != nil:
			httpjson.Error(w, http.StatusServiceUnavailable, "unavailable", "reading what the projection holds: "+err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}
