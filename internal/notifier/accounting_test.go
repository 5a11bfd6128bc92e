package notifier

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
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

func accountEveryEvent(t *testing.T, restart bool, sendWait time.Duration) {
	a := newAccounting(t)
	cfg, rc := accountingConfigs(a.url())
	if sendWait > 0 {
		cfg.SendWait = sendWait
	}
	reports := &missedReports{}
	log := slog.New(reports)
	metrics := projector.NewMetrics(nil, "notifier")
	missed := func() uint64 { return uint64(testutil.ToFloat64(metrics.Missed)) }

	stop := a.e.startNotifier(cfg, rc, metrics, log)
	if restart {
		a.write(0, accountingEvents/2)
		stop()
		stop = a.e.startNotifier(cfg, rc, metrics, log)
		a.write(accountingEvents/2, accountingEvents)
	} else {
		a.write(0, accountingEvents)
	}
	a.checkBoundRemoved()
	a.waitAccounted(15*time.Second, missed)
	stop()

	received := a.rcv.received()
	dead := a.dead()
	receivedSeq := a.receivedSeqs(received, dead)
	c := a.checkReports(reports.all(), receivedSeq, dead, true, nil)
	if c.inReports != missed() {
		t.Errorf("the reports count %d missed, the metric %d", c.inReports, missed())
	}
	if rec, _ := a.e.gapRecord(contract.EventsStream, "notifier"); rec.Missed != missed() {
		t.Errorf("the gap record says %d missed, the metric %d", rec.Missed, missed())
	}
	if sum := uint64(len(received)+len(dead)) + missed(); sum != accountingEvents {
		t.Fatalf("%d received + %d dead-lettered + %d reported missed = %d, want the %d written; neither received, dead-lettered nor in an exact report: %s\nreports:\n%s",
			len(received), len(dead), missed(), sum, accountingEvents, a.silent(receivedSeq, dead, c.reported), reports.String())
	}
	t.Logf("%d written: %d received, %d dead-lettered, %d reported missed (%s); %d handed back and finished in the background",
		accountingEvents, len(received), len(dead), missed(), reports.kinds(), reports.finishedLate())
}

// written is an event published to the effects' stream.
type written struct {
	ev  contract.Event
	seq uint64 // its stream sequence
}

// The accounting tests' writes: events events over keys documents, more
// than a small effects' stream of bound bytes holds.
const (
	accountingBound  = 24 << 10 // bytes: a few dozen events
	accountingEvents = 480
	accountingKeys   = 60
)

// accounting is the effects' stream of an accounting test, the events to
// write to it, the receiver they are notified to, and what was written.
type accounting struct {
	t     *testing.T
	e     *env
	all   []contract.Event
	index map[uuid.UUID]int // of an event in all
	rcv   *receiver
	out   []written
}

// newAccounting makes the events and a receiver that refuses one event in
// seven at every attempt (dead-lettered after MaxAttempts), one in three
// at its first attempt (handed back for a backoff), accepts the rest, and
// takes 20-50 ms for every answer.
func newAccounting(t *testing.T) *accounting {
	a := &accounting{t: t, e: newRelayedEnv(t, 4, accountingBound), all: make([]contract.Event, accountingEvents),
		index: make(map[uuid.UUID]int, accountingEvents), rcv: newReceiver(t)}
	for i := range a.all {
		a.all[i] = upsert(fmt.Sprintf("doc-%02d", i%accountingKeys), int64(i/accountingKeys+1))
		a.index[a.all[i].ID] = i
	}
	a.rcv.answer = func(ctx context.Context, q request, attempt int) (int, string) {
		select {
		case <-time.After(time.Duration(20+rand.IntN(31)) * time.Millisecond):
		case <-ctx.Done():
		}
		i, ok := a.index[q.Body.EventID]
		switch {
		case !ok:
			t.Errorf("a notification of an event never written: %s", q.Body.EventID)
			return http.StatusBadRequest, "unknown event"
		case i%7 == 3:
			return http.StatusServiceUnavailable, "refused"
		case i%3 == 1 && attempt == 1:
			return http.StatusServiceUnavailable, "refused once"
		}
		return http.StatusOK, "ok"
	}
	return a
}

func (a *accounting) url() string { return a.rcv.url("/hook") }

// write publishes the events from..to (not included) at about twice the
// rate the receiver takes them.
func (a *accounting) write(from, to int) {
	for i := from; i < to; i++ {
		a.out = append(a.out, written{ev: a.all[i], seq: a.e.publishEffect(a.all[i])})
		if i%4 == 3 {
			time.Sleep(8 * time.Millisecond)
		}
	}
}

// checkBoundRemoved fails the test when the stream's bound removed
// nothing: without removals it tests nothing.
func (a *accounting) checkBoundRemoved() {
	a.t.Helper()
	if s := a.e.streamState(contract.EventsStream); s.FirstSeq <= 1 {
		a.t.Fatalf("the stream's bound removed nothing (first sequence %d): the test tests nothing", s.FirstSeq)
	}
}

// waitAccounted waits until every event is received, dead-lettered or
// counted by missed, or the time is up: an event none of these is a
// silent loss, which the checks after it name.
func (a *accounting) waitAccounted(timeout time.Duration, missed func() uint64) {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	for len(a.rcv.received())+len(a.dead())+int(missed()) < accountingEvents && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	testenv.Eventually(a.t, "the stream and the consumer to be empty", 10*time.Second, func() bool {
		c, err := a.e.js.Consumer(context.Background(), contract.EventsStream, "notifier")
		if err != nil {
			return false
		}
		info := c.CachedInfo()
		return a.e.streamState(contract.EventsStream).Msgs == 0 && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// dead are the stream sequences of the events the notifier dead-lettered.
func (a *accounting) dead() map[uint64]bool {
	a.t.Helper()
	out := map[uint64]bool{}
	for _, m := range a.e.deadLetters("notifier") {
		seq, err := strconv.ParseUint(m.Header.Get(deadletter.HeaderSeq), 10, 64)
		if err != nil {
			a.t.Fatalf("a dead letter without its sequence: %v", m.Header)
		}
		out[seq] = true
	}
	return out
}

// receivedSeqs are the stream sequences of the events of received (by
// id); none of them may be dead-lettered as well.
func (a *accounting) receivedSeqs(received map[uuid.UUID]int, dead map[uint64]bool) map[uint64]bool {
	a.t.Helper()
	out := map[uint64]bool{}
	for _, w := range a.out {
		if received[w.ev.ID] == 0 {
			continue
		}
		out[w.seq] = true
		if dead[w.seq] {
			a.t.Errorf("event %d (%s v%d) was received and dead-lettered", w.seq, w.ev.Key, w.ev.Version)
		}
	}
	return out
}

// reportCheck is what the reports of missed events said, checked against
// the events received and dead-lettered.
type reportCheck struct {
	reported  map[uint64]bool // the sequences of the exact reports
	inReports uint64          // the events all reports count
	excused   uint64          // the sequences excused reported though received
}

// checkReports checks the reports, in the order they were logged. An
// exact report (every sequence of a range) may name no event received,
// dead-lettered or reported before, except one excused says it may; a
// window report (count of a range), when windows is true, may count no
// more than the range holds events not accounted for otherwise.
func (a *accounting) checkReports(reports []missedReport, receivedSeq, dead map[uint64]bool, windows bool,
	excused func(seq uint64, r missedReport) bool) reportCheck {
	a.t.Helper()
	bySeq := make(map[uint64]written, len(a.out))
	for _, w := range a.out {
		bySeq[w.seq] = w
	}
	c := reportCheck{reported: map[uint64]bool{}}
	for _, r := range reports {
		c.inReports += r.count
		if r.window {
			if !windows {
				continue
			}
			unaccounted := 0
			for seq := r.from; seq <= r.to; seq++ {
				if !receivedSeq[seq] && !dead[seq] && !c.reported[seq] {
					unaccounted++
				}
			}
			if r.count > uint64(unaccounted) {
				a.t.Errorf("false report: %d of %d..%d reported missed, but only %d of them were neither received nor dead-lettered (%s)", r.count, r.from, r.to, unaccounted, r.msg)
			}
			continue
		}
		for seq := r.from; seq <= r.to; seq++ {
			switch w := bySeq[seq]; {
			case excused != nil && receivedSeq[seq] && excused(seq, r):
				c.excused++
			case receivedSeq[seq]:
				a.t.Errorf("false report: event %d (%s v%d) was received and reported missed (%s)", seq, w.ev.Key, w.ev.Version, r.msg)
			case dead[seq]:
				a.t.Errorf("false report: event %d (%s v%d) was dead-lettered and reported missed (%s)", seq, w.ev.Key, w.ev.Version, r.msg)
			case c.reported[seq]:
				a.t.Errorf("event %d reported missed twice", seq)
			}
			c.reported[seq] = true
		}
	}
	return c
}

// silent are the sequences, as text, of the events neither received,
// dead-lettered nor in an exact report.
func (a *accounting) silent(receivedSeq, dead, reported map[uint64]bool) string {
	var out []string
	for _, w := range a.out {
		if !receivedSeq[w.seq] && !dead[w.seq] && !reported[w.seq] {
			out = append(out, strconv.FormatUint(w.seq, 10))
		}
	}
	return strings.Join(out, " ")
}

// startNotifier starts a notifier with cfg under a runtime with rc,
// logging to log, and returns once it consumes; stop ends it.
func (e *env) startNotifier(cfg Config, rc projector.Config, metrics *projector.Metrics, log *slog.Logger) (stop func()) {
	e.t.Helper()
	ctx := context.Background()
	n, err := New(ctx, e.js, cfg, nil, log)
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := projector.New(e.js, n, rc, metrics, log)
	if err != nil {
		e.t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	select {
	case <-r.Ready():
	case err := <-done:
		e.t.Fatalf("the runtime ended before it consumed: %v", err)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("run: %v", err)
		}
		_ = n.Close()
	}
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
