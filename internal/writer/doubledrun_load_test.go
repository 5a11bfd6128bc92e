package writer_test

// The doubled-run's loader: it sends corpus ops through the writer's HTTP
// API, as PUT/DELETE requests or NDJSON batches, from concurrent workers,
// and records every answer with the op it answers.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/testenv/corpus"
)

type drErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type drResult struct {
	Line    int          `json:"line"`
	Key     string       `json:"key"`
	Version int64        `json:"version"`
	Result  string       `json:"result"`
	EventID *uuid.UUID   `json:"event_id"`
	Error   *drErrorBody `json:"error"`
}

type drWireDoc struct {
	Key       *string         `json:"key,omitempty"`
	Version   int64           `json:"version"`
	Title     string          `json:"title,omitempty"`
	Body      string          `json:"body,omitempty"`
	Links     []string        `json:"links,omitempty"`
	Tags      []string        `json:"tags,omitempty"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	Withdrawn bool            `json:"withdrawn,omitempty"`
}

type drRecord struct {
	op  *corpus.Op
	res drResult
	via string // "single" or "batch"
}

type drLoader struct {
	base     string
	hc       *http.Client
	requests atomic.Int64

	mu   sync.Mutex
	recs []drRecord
	errs []error
}

func drNewLoader(t *testing.T, base string) *drLoader {
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &drLoader{base: base, hc: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

func drDocURL(base, key string) string { return base + "/v1/documents/" + url.PathEscape(key) }

func (l *drLoader) addRecords(rs ...drRecord) {
	l.mu.Lock()
	l.recs = append(l.recs, rs...)
	l.mu.Unlock()
}

func (l *drLoader) fail(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

// take returns and resets what was recorded.
func (l *drLoader) take() ([]drRecord, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, e := l.recs, l.errs
	l.recs, l.errs = nil, nil
	return r, e
}

func (l *drLoader) do(req *http.Request) (int, []byte, error) {
	l.requests.Add(1)
	resp, err := l.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// single sends o as PUT or DELETE.
func (l *drLoader) single(ctx context.Context, o *corpus.Op) error {
	var (
		req *http.Request
		err error
	)
	if o.Withdraw {
		req, err = http.NewRequestWithContext(ctx, http.MethodDelete,
			drDocURL(l.base, o.Key)+"?version="+strconv.FormatInt(o.Version, 10), nil)
	} else {
		w := drWireDoc{Version: o.Version, Title: o.Title, Body: o.Body, Links: o.Links, Tags: o.Tags, Meta: o.Meta}
		if o.KeyInBody {
			w.Key = &o.Key
		}
		body, merr := json.Marshal(w)
		if merr != nil {
			return merr
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, drDocURL(l.base, o.Key), bytes.NewReader(body))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return err
	}
	status, data, err := l.do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("%s: %s %s: status %d: %.300s", o, req.Method, req.URL.EscapedPath(), status, data)
	}
	var r drResult
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: decoding %.300s: %w", o, data, err)
	}
	if r.Key != o.Key || r.Version != o.Version {
		return fmt.Errorf("%s: answered for %q@%d", o, r.Key, r.Version)
	}
	l.addRecords(drRecord{op: o, res: r, via: "single"})
	return nil
}

// batch sends ops as one NDJSON request and checks that every line is
// answered exactly once.
func (l *drLoader) batch(ctx context.Context, ops []*corpus.Op) error {
	var buf bytes.Buffer
	for _, o := range ops {
		w := drWireDoc{Key: &o.Key, Version: o.Version, Withdrawn: o.Withdraw}
		if !o.Withdraw {
			w.Title, w.Body, w.Links, w.Tags, w.Meta = o.Title, o.Body, o.Links, o.Tags, o.Meta
		}
		line, err := json.Marshal(w)
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/documents:batch", &buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	status, data, err := l.do(req)
	if err != nil {
		return fmt.Errorf("batch of %d: %w", len(ops), err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("batch of %d: status %d: %.300s", len(ops), status, data)
	}
	got := make([]*drResult, len(ops))
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r drResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("batch of %d: result line %.300q: %w", len(ops), sc.Text(), err)
		}
		if r.Line < 1 || r.Line > len(ops) || got[r.Line-1] != nil {
			return fmt.Errorf("batch of %d: unexpected or repeated result line %.300q", len(ops), sc.Text())
		}
		got[r.Line-1] = &r
	}
	if err := sc.Err(); err != nil {
		return err
	}
	recs := make([]drRecord, 0, len(ops))
	var missing []int
	for i, r := range got {
		switch {
		case r == nil:
			missing = append(missing, i+1)
		case r.Key != ops[i].Key || r.Version != ops[i].Version:
			return fmt.Errorf("batch line %d (%s) answered for %q@%d", i+1, ops[i], r.Key, r.Version)
		default:
			recs = append(recs, drRecord{op: ops[i], res: *r, via: "batch"})
		}
	}
	l.addRecords(recs...)
	if len(missing) > 0 {
		return fmt.Errorf("batch of %d lines: %d lines not answered (first: line %d, %s)",
			len(ops), len(missing), missing[0], ops[missing[0]-1])
	}
	return nil
}

// drUnit is one piece of work for a worker: an NDJSON request, or PUT/DELETE
// requests one after another. With copies > 1 the unit is sent that many
// times at once, to race identical writes against each other.
type drUnit struct {
	batch  []*corpus.Op
	seq    []*corpus.Op
	copies int
}

func (l *drLoader) runUnit(ctx context.Context, u drUnit) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range max(u.copies, 1) {
		wg.Go(func() {
			<-start
			if u.batch != nil {
				if err := l.batch(ctx, u.batch); err != nil {
					l.fail(err)
				}
				return
			}
			for _, o := range u.seq {
				if err := l.single(ctx, o); err != nil {
					l.fail(err)
					return // later versions of the key would be out of order
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// load runs units on workers and returns what was answered.
func (l *drLoader) load(ctx context.Context, workers int, units []drUnit) ([]drRecord, []error) {
	ch := make(chan drUnit)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for u := range ch {
				l.runUnit(ctx, u)
			}
		})
	}
	for _, u := range units {
		ch <- u
	}
	close(ch)
	wg.Wait()
	return l.take()
}
