package notifier

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Every event written to a small effects' stream is, in the end, exactly
// one of: received (answered 2xx by the webhook), dead-lettered, or
// reported missed; never two of them, never none. The receiver is slow
// and fails some attempts, so while events keep coming the stream's size
// bound removes events of every kind: never delivered, delivered and
// still in hand, handed back for a backoff. Neither a restart of the
// runtime in the middle of the writes, nor sends that outlast the wait
// for them (their events handed back while they go on), may change the
// count.
func TestEveryEventIsReceivedDeadLetteredOrReportedMissed(t *testing.T) {
	for _, c := range []struct {
		name     string
		restart  bool
		sendWait time.Duration
	}{
		{name: "slow receiver"},
		{name: "restarted runtime", restart: true},
		{name: "sends outlast their wait", sendWait: 30 * time.Millisecond},
		{name: "restarted, sends outlast their wait", restart: true, sendWait: 30 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) { accountEveryEvent(t, c.restart, c.sendWait) })
	}
}

// accountingConfigs are the notifier's and its runtime's settings of the
// accounting tests, for the webhook url: three attempts of an event, short
// backoffs, a one-second acknowledgement wait.
func accountingConfigs(url string) (Config, projector.Config) {
	cfg := testConfig(url)
	cfg.MaxAttempts, cfg.RetryMin, cfg.RetryMax = 3, 100*time.Millisecond, 400*time.Millisecond
	rc := RuntimeConfig(projector.Config{Name: "notifier", BatchSize: 16, AckWait: time.Second, LagInterval: 100 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	return cfg, rc
}

// written is an event published to the effects' stream.
type written struct {
	ev  contract.Event
	seq uint64 // its stream sequence
}

func accountEveryEvent(t *testing.T, restart bool, sendWait time.Duration) {
	const (
		bound  = 24 << 10 // bytes: a few dozen events
		events = 480
		keys   = 60
	)
	e := newRelayedEnv(t, 4, bound)
	ctx := context.Background()

	all := make([]contract.Event, events)
	index := make(map[uuid.UUID]int, events)
	for i := range all {
		all[i] = upsert(fmt.Sprintf("doc-%02d", i%keys), int64(i/keys+1))
		index[all[i].ID] = i
	}
	// One event in seven is refused at every attempt (dead-lettered after
	// MaxAttempts), one in three at its first attempt (handed back for a
	// backoff), the rest accepted; every answer takes 20-50 ms.
	rcv := newSlowReceiver(t, func(id uuid.UUID, attempt int) int {
		i, ok := index[id]
		switch {
		case !ok:
			t.Errorf("a notification of an event never written: %s", id)
			return http.StatusBadRequest
		case i%7 == 3:
			return http.StatusServiceUnavailable
		case i%3 == 1 && attempt == 1:
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	cfg, rc := accountingConfigs(rcv.srv.URL + "/hook")
	if sendWait > 0 {
		cfg.SendWait = sendWait
	}

	reports := &missedReports{}
	log := slog.New(reports)
	metrics := projector.NewMetrics(nil, "notifier")
	start := func() (stop func()) {
		n, err := New(ctx, e.js, cfg, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		r, err := projector.New(e.js, n, rc, metrics, log)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		select {
		case <-r.Ready():
		case err := <-done:
			t.Fatalf("the runtime ended before it consumed: %v", err)
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			_ = n.Close()
		}
	}
	stop := start()

	// The writes, at about twice the rate the receiver takes them.
	var out []written
	for i, ev := range all {
		if restart && i == events/2 {
			stop()
			stop = start()
		}
		out = append(out, written{ev: ev, seq: e.publishEffect(ev)})
		if i%4 == 3 {
			time.Sleep(8 * time.Millisecond)
		}
	}
	if s := e.streamState(contract.EventsStream); s.FirstSeq <= 1 {
		t.Fatalf("the stream's bound removed nothing (first sequence %d): the test tests nothing", s.FirstSeq)
	}

	// Every event accounted for, or the time is up: an event neither
	// received, dead-lettered nor reported is a silent loss.
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := len(rcv.received()) + len(e.deadLetterSeqs("notifier")) + int(testutil.ToFloat64(metrics.Missed))
		if got >= events || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	testenv.Eventually(t, "the stream and the consumer to be empty", 10*time.Second, func() bool {
		c, err := e.js.Consumer(ctx, contract.EventsStream, "notifier")
		if err != nil {
			return false
		}
		info := c.CachedInfo()
		return e.streamState(contract.EventsStream).Msgs == 0 && info.NumPending == 0 && info.NumAckPending == 0
	})
	stop()

	received := rcv.received()
	dead := e.deadLetterSeqs("notifier")
	missed := uint64(testutil.ToFloat64(metrics.Missed))
	bySeq := make(map[uint64]written, len(out))
	for _, w := range out {
		bySeq[w.seq] = w
	}
	// No event in two classes.
	receivedSeq := map[uint64]bool{}
	for id := range received {
		w := out[index[id]]
		receivedSeq[w.seq] = true
		if dead[w.seq] {
			t.Errorf("event %d (%s v%d) was received and dead-lettered", w.seq, w.ev.Key, w.ev.Version)
		}
	}
	reported := map[uint64]bool{}
	var inReports uint64
	for _, r := range reports.all() {
		inReports += r.count
		unaccounted := 0
		for seq := r.from; seq <= r.to; seq++ {
			switch w := bySeq[seq]; {
			case receivedSeq[seq]:
				if !r.window {
					t.Errorf("false report: event %d (%s v%d) was received and reported missed (%s)", seq, w.ev.Key, w.ev.Version, r.msg)
				}
			case dead[seq]:
				if !r.window {
					t.Errorf("false report: event %d (%s v%d) was dead-lettered and reported missed (%s)", seq, w.ev.Key, w.ev.Version, r.msg)
				}
			case reported[seq]:
				if !r.window {
					t.Errorf("event %d reported missed twice", seq)
				}
			default:
				unaccounted++
			}
		}
		if r.window && r.count > uint64(unaccounted) {
			t.Errorf("false report: %d of %d..%d reported missed, but only %d of them were neither received nor dead-lettered (%s)", r.count, r.from, r.to, unaccounted, r.msg)
		}
		if !r.window {
			for seq := r.from; seq <= r.to; seq++ {
				reported[seq] = true
			}
		}
	}
	cons, err := e.js.Consumer(ctx, contract.EventsStream, "notifier")
	if err != nil {
		t.Fatal(err)
	}
	if inReports != missed {
		t.Errorf("the reports count %d missed, the metric %d", inReports, missed)
	}
	rec, _ := projector.ReadGapRecord(cons.CachedInfo().Config.Metadata)
	if rec.Missed != missed {
		t.Errorf("the gap record says %d missed, the metric %d", rec.Missed, missed)
	}
	if sum := uint64(len(received)+len(dead)) + missed; sum != events {
		var silent []string
		for _, w := range out {
			if !receivedSeq[w.seq] && !dead[w.seq] && !reported[w.seq] {
				silent = append(silent, strconv.FormatUint(w.seq, 10))
			}
		}
		t.Fatalf("%d received + %d dead-lettered + %d reported missed = %d, want the %d written; neither received, dead-lettered nor in an exact report: %s\nreports:\n%s",
			len(received), len(dead), missed, sum, events, strings.Join(silent, " "), reports.String())
	}
	t.Logf("%d written: %d received, %d dead-lettered, %d reported missed (%s); %d handed back and finished in the background",
		events, len(received), len(dead), missed, reports.kinds(), reports.finishedLate())
}

// publishEffect stores ev on the effects' stream as the relay does and
// returns its stream sequence.
func (e *env) publishEffect(ev contract.Event) uint64 {
	e.t.Helper()
	data, err := ev.Encode()
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(contract.EventsSubject(ev.Key))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, ev.ID.String())
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	ack, err := e.js.PublishMsg(context.Background(), m)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

func (e *env) streamState(stream string) jetstream.StreamState {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), stream)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.CachedInfo().State
}

// deadLetterSeqs are the stream sequences of the events consumer
// dead-lettered.
func (e *env) deadLetterSeqs(consumer string) map[uint64]bool {
	e.t.Helper()
	out := map[uint64]bool{}
	if _, err := e.js.Stream(context.Background(), deadletter.Stream); err != nil {
		return out // not created yet
	}
	for _, m := range e.deadLetters(consumer) {
		seq, err := strconv.ParseUint(m.Header.Get(deadletter.HeaderSeq), 10, 64)
		if err != nil {
			e.t.Fatalf("a dead letter without its sequence: %v", m.Header)
		}
		out[seq] = true
	}
	return out
}

// slowReceiver is a webhook receiver that answers each request after 20 to
// 50 ms with the status status gives the attempt (1 for the first) of an
// event, and keeps the events it answered 2xx.
type slowReceiver struct {
	srv    *httptest.Server
	status func(event uuid.UUID, attempt int) int

	mu       sync.Mutex
	attempts map[uuid.UUID]int
	ok       map[uuid.UUID]int
}

func newSlowReceiver(t *testing.T, status func(event uuid.UUID, attempt int) int) *slowReceiver {
	t.Helper()
	r := &slowReceiver{status: status, attempts: map[uuid.UUID]int{}, ok: map[uuid.UUID]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *slowReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var n Notification
	if err == nil {
		err = json.Unmarshal(body, &n)
	}
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.attempts[n.EventID]++
	attempt := r.attempts[n.EventID]
	r.mu.Unlock()
	select {
	case <-time.After(time.Duration(20+rand.IntN(31)) * time.Millisecond):
	case <-req.Context().Done():
		return
	}
	status := r.status(n.EventID, attempt)
	if status/100 == 2 {
		r.mu.Lock()
		r.ok[n.EventID]++
		r.mu.Unlock()
	}
	w.WriteHeader(status)
}

// received are the events answered 2xx, with the number of such answers.
func (r *slowReceiver) received() map[uuid.UUID]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uuid.UUID]int, len(r.ok))
	for id, c := range r.ok {
		out[id] = c
	}
	return out
}

// missedReport is one report of events never delivered: the stream
// sequences from..to, all of them missed, or (window) count of them.
type missedReport struct {
	from, to, count uint64
	window          bool
	msg             string
}

// missedReports is a log handler keeping the runtime's reports of missed
// events.
type missedReports struct {
	mu      sync.Mutex
	reports []missedReport
	late    int // events handed back, removed, and finished meanwhile
}

func (h *missedReports) Enabled(context.Context, slog.Level) bool { return true }
func (h *missedReports) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *missedReports) WithGroup(string) slog.Handler            { return h }

func (h *missedReports) Handle(_ context.Context, rec slog.Record) error {
	var r missedReport
	found := false
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "missed":
			r.count, found = attrUint(a.Value), true
		case "from":
			r.from = attrUint(a.Value)
		case "to":
			r.to = attrUint(a.Value)
		}
		return true
	})
	if !found {
		if strings.Contains(rec.Message, "finished meanwhile") {
			h.mu.Lock()
			h.late++
			h.mu.Unlock()
		}
		return nil
	}
	r.msg = rec.Message
	r.window = r.count != r.to-r.from+1
	h.mu.Lock()
	h.reports = append(h.reports, r)
	h.mu.Unlock()
	return nil
}

func attrUint(v slog.Value) uint64 {
	if v.Kind() == slog.KindInt64 {
		return uint64(v.Int64())
	}
	return v.Uint64()
}

func (h *missedReports) all() []missedReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reports)
}

func (h *missedReports) finishedLate() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.late
}

// kinds sums the events reported by kind of report.
func (h *missedReports) kinds() string {
	sums := map[string]uint64{}
	for _, r := range h.all() {
		kind := "never delivered"
		switch {
		case strings.Contains(r.msg, "handed back"):
			kind = "handed back"
		case strings.Contains(r.msg, "across its restart"):
			kind = "owed across the restart"
		case r.window:
			kind = "pending at the start"
		}
		sums[kind] += r.count
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, sums[k]))
	}
	return strings.Join(parts, ", ")
}

func (h *missedReports) String() string {
	var b strings.Builder
	for _, r := range h.all() {
		fmt.Fprintf(&b, "%d..%d: %d: %s\n", r.from, r.to, r.count, r.msg)
	}
	return b.String()
}
