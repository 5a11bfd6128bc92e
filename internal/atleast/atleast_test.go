package atleast_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
)

func TestParseWrite(t *testing.T) {
	for in, want := range map[string]atleast.Write{
		"kb/wal@3": {Key: "kb/wal", Version: 3}, "a@b@12": {Key: "a@b", Version: 12},
	} {
		got, err := atleast.ParseWrite(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseWrite(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "kb/wal", "@3", "kb@0", "kb@-1", "kb@x"} {
		if _, err := atleast.ParseWrite(bad); err == nil {
			t.Errorf("ParseWrite(%q): no error", bad)
		}
	}
}

// versionsAfter holds a at version 1 until calls reach n, then at 2.
func versionsAfter(n int64, calls *atomic.Int64) atleast.Versions {
	return func(context.Context, []string) (map[string]int64, error) {
		if calls.Add(1) >= n {
			return map[string]int64{"a": 2}, nil
		}
		return map[string]int64{"a": 1}, nil
	}
}

func TestWaitReturnsOnceTheProjectionHoldsTheWrites(t *testing.T) {
	var calls atomic.Int64
	err := atleast.Wait(context.Background(), []atleast.Write{{Key: "a", Version: 2}}, time.Second, versionsAfter(4, &calls))
	if err != nil || calls.Load() != 4 {
		t.Fatalf("err %v after %d reads, want nil after 4", err, calls.Load())
	}
	// A newer version than asked counts.
	if err := atleast.Wait(context.Background(), []atleast.Write{{Key: "a", Version: 1}}, 0, versionsAfter(1, &calls)); err != nil {
		t.Fatal(err)
	}
}

func TestWaitSaysHowFarTheProjectionIs(t *testing.T) {
	var calls atomic.Int64
	err := atleast.Wait(context.Background(), []atleast.Write{{Key: "a", Version: 2}, {Key: "b", Version: 1}}, 30*time.Millisecond, versionsAfter(1<<30, &calls))
	var notYet *atleast.NotYetError
	if !errors.As(err, &notYet) || len(notYet.Behind) != 2 || notYet.Waited < 30*time.Millisecond {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"a@2 (it holds version 1)", "b@1 (it holds no version)", "2 of the writes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

func TestHandler(t *testing.T) {
	var calls atomic.Int64
	served := 0
	h := atleast.Handler(versionsAfter(3, &calls), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusOK)
	}))
	get := func(q url.Values) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/search?"+q.Encode(), nil))
		return rec
	}
	if rec := get(url.Values{"q": {"x"}}); rec.Code != http.StatusOK || calls.Load() != 0 {
		t.Fatalf("without after: %d, %d reads of the projection", rec.Code, calls.Load())
	}
	q := url.Values{}
	atleast.Query(q, time.Second, atleast.Write{Key: "a", Version: 2})
	if rec := get(q); rec.Code != http.StatusOK || served != 2 {
		t.Fatalf("after a@2: %d %s", rec.Code, rec.Body)
	}
	q = url.Values{}
	atleast.Query(q, 20*time.Millisecond, atleast.Write{Key: "a", Version: 9})
	rec := get(q)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not_yet_applied") ||
		!strings.Contains(rec.Body.String(), "a@9 (it holds version 2)") || served != 2 {
		t.Fatalf("after a@9: %d %s", rec.Code, rec.Body)
	}
	// The writes not held, as data beside the message.
	var body atleast.NotYetBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body.Behind) != 1 ||
		body.Behind[0] != (atleast.BehindJSON{Key: "a", Version: 9, Holds: 2}) || body.WaitedMS < 20 || body.Error.Code != "not_yet_applied" {
		t.Fatalf("after a@9: body %s (%v)", rec.Body, err)
	}
	for _, bad := range []url.Values{{"after": {"a"}}, {"after": {"a@1"}, "wait": {"2h"}}, {"after": {"a@1"}, "wait": {"soon"}}} {
		if rec := get(bad); rec.Code != http.StatusBadRequest {
			t.Errorf("%v: %d, want 400", bad, rec.Code)
		}
	}
}
