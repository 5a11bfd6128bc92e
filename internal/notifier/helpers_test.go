package notifier

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

var testSecret = []byte("whsec_test-secret")

// request is one request the receiver got.
type request struct {
	Path     string
	Key      string // Idempotency-Key
	Attempt  string
	Status   int // the receiver's answer
	Verified bool
	Body     Notification
	// TraceParent is the request's traceparent header.
	TraceParent string
}

// receiver is a webhook receiver in the test process (127.0.0.1 only). It
// verifies every request's signature on its own (not with this package's
// code), and answers with answer (nil: 200).
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	secret []byte

	mu          sync.Mutex
	reqs        []request
	arrivals    map[string]int // by path and key
	inFlight    map[string]int
	maxInFlight map[string]int
	// answer returns the status and body of q, the n-th request (1-based,
	// in order of arrival) of an effect on its path; it may block (it gets
	// the request's context).
	answer func(ctx context.Context, q request, n int) (int, string)
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{t: t, secret: testSecret, arrivals: map[string]int{}, inFlight: map[string]int{}, maxInFlight: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) url(path string) string { return r.srv.URL + path }

// signedRight checks a request's signature on its own, as a receiver
// would, without this package's Sign or Verify.
func signedRight(secret []byte, h http.Header, body []byte) bool {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(h.Get("Converge-Timestamp") + "." + string(body)))
	return h.Get("Converge-Signature") == "sha256="+hex.EncodeToString(mac.Sum(nil))
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	got := request{Path: req.URL.Path, Key: req.Header.Get("Idempotency-Key"), Attempt: req.Header.Get("Converge-Attempt"),
		TraceParent: req.Header.Get("traceparent")}
	got.Verified = req.Method == http.MethodPost && signedRight(r.secret, req.Header, body)
	if err := json.Unmarshal(body, &got.Body); err != nil {
		got.Verified = false
	}
	r.mu.Lock()
	r.arrivals[got.Path+" "+got.Key]++
	n := r.arrivals[got.Path+" "+got.Key]
	r.inFlight[got.Path]++
	r.maxInFlight[got.Path] = max(r.maxInFlight[got.Path], r.inFlight[got.Path])
	answer := r.answer
	r.mu.Unlock()
	status, text := http.StatusOK, "ok"
	if answer != nil {
		status, text = answer(req.Context(), got, n)
	}
	got.Status = status
	r.mu.Lock()
	r.inFlight[got.Path]--
	if req.Context().Err() != nil {
		got.Status = 0 // the sender gave up waiting
	}
	r.reqs = append(r.reqs, got)
	r.mu.Unlock()
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

func (r *receiver) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.reqs...)
}

// received are the events answered 2xx, with the number of such answers.
func (r *receiver) received() map[uuid.UUID]int {
	out := map[uuid.UUID]int{}
	for _, q := range r.requests() {
		if q.Status/100 == 2 {
			out[q.Body.EventID]++
		}
	}
	return out
}

func (r *receiver) count(path string) int {
	n := 0
	for _, q := range r.requests() {
		if q.Path == path {
			n++
		}
	}
	return n
}

// check asserts that every request was signed correctly and carried the
// Idempotency-Key the contract derives from its URL and event, and returns
// the number of requests per effect.
func (r *receiver) check() map[string]int {
	r.t.Helper()
	perEffect := map[string]int{}
	for _, q := range r.requests() {
		if !q.Verified {
			r.t.Errorf("request to %s with key %s: bad signature or body", q.Path, q.Key)
		}
		want := contract.EffectID("webhook:"+r.url(q.Path), q.Body.EventID).String()
		if q.Key != want || q.Body.EffectID.String() != want {
			r.t.Errorf("request to %s for event %s: key %s (body %s), want %s", q.Path, q.Body.EventID, q.Key, q.Body.EffectID, want)
		}
		perEffect[q.Key]++
	}
	return perEffect
}

type env struct {
	t  *testing.T
	n  *testenv.NATS
	nc *nats.Conn
	js jetstream.JetStream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := testenv.StartNATS(t)
	nc, js := n.DocsStream(t)
	return &env{t: t, n: n, nc: nc, js: js}
}

// publish stores ev on its subject, committed at committed, without a
// Nats-Msg-Id: each call stores one more copy (a redelivery, a replay).
func (e *env) publish(ev contract.Event, committed time.Time) {
	e.t.Helper()
	data, err := ev.Encode()
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(contract.Subject(ev.Key))
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, committed.UTC().Format(time.RFC3339Nano))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

func upsert(key string, version int64) contract.Event {
	d, err := contract.Document{Key: key, Version: version, Title: "title of " + key, Body: fmt.Sprintf("body of %s at %d", key, version)}.Normalize()
	if err != nil {
		panic(err)
	}
	return contract.NewUpsertedEvent(d, []string{d.Body})
}

// testConfig is a Config for tests: fast retries, short timeouts.
func testConfig(urls ...string) Config {
	return Config{URLs: urls, Secret: testSecret, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		HTTPTimeout: 5 * time.Second, ClaimTimeout: 10 * time.Second, SendWait: 2 * time.Second, Owner: "test"}
}

// newNotifier is a notifier with cfg on e's dedup store, closed when the
// test ends.
func (e *env) newNotifier(cfg Config) *Notifier {
	e.t.Helper()
	n, err := New(context.Background(), e.js, cfg, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = n.Close() })
	return n
}

// run runs a notifier named name (its durable consumer) until it has
// caught up with the stream, and returns its metrics.
func (e *env) run(name string, cfg Config) *Metrics {
	e.t.Helper()
	m := NewMetrics(nil)
	n, err := New(context.Background(), e.js, cfg, m, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	e.runStore(name, n)
	return m
}

func (e *env) runStore(name string, store projector.Store) {
	e.t.Helper()
	r, err := projector.New(e.js, store, projector.Config{Name: name, EveryEvent: true, StopWhenCaughtUp: true, BatchSize: 16,
		AckWait: 5 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		e.t.Fatal(err)
	}
	if ctx.Err() != nil {
		e.t.Fatal("the notifier did not catch up within 60s")
	}
}

// replay deletes the notifier's durable consumer: the next run starts
// from the stream's first message, as after `converge replay`.
func (e *env) replay(name string) {
	e.t.Helper()
	if err := e.js.DeleteConsumer(context.Background(), "CONVERGE_DOCS", name); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) record(effect uuid.UUID) (record, error) {
	kv, err := e.js.KeyValue(context.Background(), DefaultBucket)
	if err != nil {
		return record{}, err
	}
	entry, err := kv.Get(context.Background(), effect.String())
	if err != nil {
		return record{}, err
	}
	var rec record
	err = json.Unmarshal(entry.Value(), &rec)
	return rec, err
}

func (e *env) deadLetters(name string) []*jetstream.RawStreamMsg {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), deadletter.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(context.Background(), seq); err == nil && m.Subject == contract.DLQSubject(name) {
			out = append(out, m)
		}
	}
	return out
}

// streamState is the state of stream as the server last reported it.
func (e *env) streamState(stream string) jetstream.StreamState {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), stream)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.CachedInfo().State
}

// gapRecord is the record of missed events that the runtime keeps in the
// metadata of consumer on stream, and whether there is one.
func (e *env) gapRecord(stream, consumer string) (projector.GapRecord, bool) {
	e.t.Helper()
	c, err := e.js.Consumer(context.Background(), stream, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	return projector.ReadGapRecord(c.CachedInfo().Config.Metadata)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// nameOf is the public name of u, one of urls: its metrics' label.
func nameOf(urls []string, u string) string {
	i := slices.Index(urls, u)
	if i < 0 {
		panic(u + " is not one of the URLs")
	}
	return targetNames(urls)[i]
}

// removalRecords are the stream sequences of stream's events that the
// removals' stream records removed from consumer's hands.
func (e *env) removalRecords(stream, consumer string) map[uint64]bool {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), contract.RemovalsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[uint64]bool{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			continue
		}
		var a struct {
			Stream    string `json:"stream"`
			Consumer  string `json:"consumer"`
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &a) == nil && a.Stream == stream && a.Consumer == consumer {
			out[a.StreamSeq] = true
		}
	}
	return out
}
