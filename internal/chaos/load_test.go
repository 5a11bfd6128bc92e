//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converge-sync/converge/internal/auth"
)

// write is one write the writer acknowledged (200 with a result).
type write struct {
	Key      string
	Version  int64
	Withdraw bool
	Result   string // applied, unchanged, stale
	At       time.Time
}

// load is the producers: each owns a share of the documents (so that its
// versions of a document only grow), writes a new version of one of them
// (a withdrawal one time in withdrawEvery) at its share of the rate, and
// retries a write until the writer acknowledges it, with the same
// content: a write committed before its answer was lost is acknowledged
// "unchanged" the second time.
type load struct {
	api, token string
	docs       int
	producers  int
	rate       float64 // writes per second, all producers together (0: as fast as they can)
	seed       uint64

	acked    atomic.Int64
	attempts atomic.Int64
	failures atomic.Int64 // attempts without an acknowledgement (retried)

	mu     sync.Mutex
	writes []write
	codes  map[string]int // unexpected answers, by status and code
}

const withdrawEvery = 10

func docKey(i int) string { return fmt.Sprintf("doc/%04d", i) }

// run writes until ctx ends.
func (l *load) run(ctx context.Context) {
	l.codes = map[string]int{}
	var wg sync.WaitGroup
	for p := range l.producers {
		wg.Go(func() { l.produce(ctx, p) })
	}
	wg.Wait()
}

func (l *load) produce(ctx context.Context, p int) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(p)+1))
	var keys []int
	for i := p; i < l.docs; i += l.producers {
		keys = append(keys, i)
	}
	versions := make(map[int]int64, len(keys))
	client := &http.Client{Timeout: 10 * time.Second}
	var pace time.Duration
	if l.rate > 0 {
		pace = time.Duration(float64(time.Second) * float64(l.producers) / l.rate)
	}
	next := time.Now()
	for ctx.Err() == nil {
		if pace > 0 {
			next = next.Add(pace)
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			} else if d < -time.Second {
				next = time.Now() // behind after an outage: no burst to catch up
			}
		}
		i := keys[rng.IntN(len(keys))]
		versions[i]++
		w := write{Key: docKey(i), Version: versions[i], Withdraw: rng.IntN(withdrawEvery) == 0}
		for ctx.Err() == nil {
			result, err := l.send(ctx, client, w)
			if err == nil {
				l.attempts.Add(1)
				w.Result, w.At = result, time.Now()
				l.mu.Lock()
				l.writes = append(l.writes, w)
				l.mu.Unlock()
				l.acked.Add(1)
				break
			}
			if ctx.Err() != nil {
				return // the load ended during the request: not a failure
			}
			l.attempts.Add(1)
			l.failures.Add(1)
			var se *statusError
			if errors.As(err, &se) && se.code >= 400 && se.code < 500 {
				break // refused: a retry would be refused too (counted in codes)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// body is the document of a write: a function of its key and version
// alone, so that a retry sends the same content.
func body(key string, version int64) []byte {
	n := 0
	fmt.Sscanf(key, "doc/%d", &n)
	doc := map[string]any{
		"version": version,
		"title":   fmt.Sprintf("Document %d, version %d", n, version),
		"body": fmt.Sprintf("Paragraph one of document %d at version %d.\n\nParagraph two, %s.\n\nParagraph three: %s.",
			n, version, strings.Repeat("words ", 20+int(version%30)), strings.Repeat("more ", 10+n%20)),
		"links": []string{docKey((n + 1) % 1000), docKey((n*7 + int(version)) % 1000)},
		"tags":  []string{fmt.Sprint("t", n%5), fmt.Sprint("v", version%3)},
		"meta":  map[string]any{"producer": "chaos", "version": version},
	}
	b, _ := json.Marshal(doc)
	return b
}

func (l *load) send(ctx context.Context, client *http.Client, w write) (string, error) {
	u := l.api + "/v1/documents/" + url.PathEscape(w.Key)
	var req *http.Request
	var err error
	if w.Withdraw {
		req, err = http.NewRequestWithContext(ctx, http.MethodDelete, fmt.Sprintf("%s?version=%d", u, w.Version), nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body(w.Key, w.Version)))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return "", err
	}
	auth.SetBearer(req.Header, l.token)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		l.mu.Lock()
		l.codes[fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Code)]++
		l.mu.Unlock()
		return "", &statusError{code: resp.StatusCode, body: string(b)}
	}
	var r struct {
		Key     string `json:"key"`
		Version int64  `json:"version"`
		Result  string `json:"result"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Key != w.Key || r.Version != w.Version || r.Result == "" {
		return "", fmt.Errorf("answer %s for %s v%d", b, w.Key, w.Version)
	}
	return r.Result, nil
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return fmt.Sprintf("status %d: %s", e.code, e.body) }

func (l *load) acknowledged() []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]write(nil), l.writes...)
}

// startLoad starts cfg's producers against the pipeline's writer; stop
// ends them and waits until they have (it may be called again).
func (p *pipeline) startLoad(ctx context.Context, cfg runConfig) (l *load, stop func()) {
	l = &load{api: p.api, token: p.writeToken, docs: cfg.docs, producers: cfg.producers, rate: cfg.rate, seed: cfg.seed}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { l.run(ctx) })
	return l, func() { cancel(); wg.Wait() }
}
