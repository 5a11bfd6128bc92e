package notifier

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// events is a small corpus: versions of a few documents and a withdrawal.
func events() []contract.Event {
	var evs []contract.Event
	for i := range 6 {
		for v := int64(1); v <= 3; v++ {
			evs = append(evs, upsert(fmt.Sprintf("doc-%d", i), v))
		}
	}
	return append(evs, contract.NewWithdrawnEvent("doc-0", 4))
}

// Every event delivered three times (in one run, in batches and across
// them, then again in later runs) gives exactly one POST per effect id,
// to every target, each verified by the receiver.
func TestEveryEventDeliveredThreeTimesIsSentOnce(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	evs := events()
	for range 3 {
		for _, ev := range evs {
			e.publish(ev, time.Now())
		}
	}
	cfg := testConfig(rcv.url("/a"), rcv.url("/b"))
	m := e.run("notifier", cfg)
	effects := 2 * len(evs)
	perEffect := rcv.check()
	if len(perEffect) != effects {
		t.Fatalf("%d effects received, want %d", len(perEffect), effects)
	}
	for key, n := range perEffect {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs, want 1", key, n)
		}
	}
	for _, path := range []string{"/a", "/b"} {
		if n := testutil.ToFloat64(m.Sent.WithLabelValues(nameOf(cfg.URLs, rcv.url(path)))); n != float64(len(evs)) {
			t.Errorf("sent to %s: %v, want %d", path, n, len(evs))
		}
	}

	// Two more deliveries of each, in two later runs: nothing is sent,
	// everything is found in the dedup store.
	for range 2 {
		for _, ev := range evs {
			e.publish(ev, time.Now())
		}
		m = e.run("notifier", cfg)
		if got := len(rcv.requests()); got != effects {
			t.Fatalf("%d requests after the redeliveries, want %d", got, effects)
		}
		var dedup float64
		for _, path := range []string{"/a", "/b"} {
			dedup += testutil.ToFloat64(m.Deduplicated.WithLabelValues(nameOf(cfg.URLs, rcv.url(path))))
		}
		if dedup != float64(effects) {
			t.Errorf("deduplicated %v, want %d", dedup, effects)
		}
	}
	rec, err := e.record(EffectID(rcv.url("/a"), evs[0].ID))
	if err != nil || rec.State != stateSent || rec.Attempts != 1 || rec.EventID != evs[0].ID.String() {
		t.Fatalf("record of the first effect: %+v %v", rec, err)
	}
}

// A full replay of the stream, and a rebuild by a new consumer, send
// nothing again; events older than the window are not notified unless
// NotifyReplayed, and then only once.
func TestReplayAndRebuildSendNothingAgain(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	evs := events()
	for _, ev := range evs {
		e.publish(ev, time.Now())
	}
	cfg := testConfig(rcv.url("/hook"))
	cfg.Window = time.Hour
	e.run("notifier", cfg)
	sent := len(rcv.requests())
	if sent != len(evs) {
		t.Fatalf("%d POSTs, want %d", sent, len(evs))
	}

	e.replay("notifier")
	m := e.run("notifier", cfg)
	if got := len(rcv.requests()) - sent; got != 0 {
		t.Fatalf("the replay sent %d new POSTs, want 0", got)
	}
	if n := testutil.ToFloat64(m.Deduplicated.WithLabelValues(nameOf(cfg.URLs, rcv.url("/hook")))); n != float64(len(evs)) {
		t.Fatalf("the replay deduplicated %v, want %d", n, len(evs))
	}
	e.run("rebuild", cfg) // another consumer, from the stream's start
	if got := len(rcv.requests()) - sent; got != 0 {
		t.Fatalf("the rebuild sent %d new POSTs, want 0", got)
	}

	// Events committed two hours ago, beyond the window, never notified:
	// skipped, also on replay, unless the operator asks.
	old := []contract.Event{upsert("old-1", 1), upsert("old-2", 1)}
	for _, ev := range old {
		e.publish(ev, time.Now().Add(-2*time.Hour))
	}
	m = e.run("notifier", cfg)
	if got := len(rcv.requests()) - sent; got != 0 {
		t.Fatalf("%d POSTs for events beyond the window", got)
	}
	if n := testutil.ToFloat64(m.Skipped.WithLabelValues("beyond_window")); n != 2 {
		t.Fatalf("skipped beyond the window: %v", n)
	}
	e.replay("notifier")
	cfg.NotifyReplayed = true
	e.run("notifier", cfg)
	if got := len(rcv.requests()) - sent; got != len(old) {
		t.Fatalf("with NotifyReplayed: %d new POSTs, want %d (only the events never sent)", got, len(old))
	}
	e.replay("notifier")
	e.run("notifier", cfg)
	if got := len(rcv.requests()) - sent; got != len(old) {
		t.Fatalf("a second replay with NotifyReplayed sent %d more", got-len(old))
	}
	for key, n := range rcv.check() {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs", key, n)
		}
	}
}

// A re-emitted event (a repair of the projections) is not notified.
func TestReemissionIsNotNotified(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	ev := upsert("repaired", 1)
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(contract.Subject(ev.Key))
	msg.Data = data
	msg.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	msg.Header.Set(contract.HeaderReemission, "1")
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	m := e.run("notifier", testConfig(rcv.url("/hook")))
	if got := len(rcv.requests()); got != 0 {
		t.Fatalf("%d POSTs for a re-emission", got)
	}
	if n := testutil.ToFloat64(m.Skipped.WithLabelValues("reemission")); n != 1 {
		t.Fatalf("skipped re-emissions: %v", n)
	}
}

// A receiver answering 500, then 200: one success, the retry counted, the
// same key and body on both attempts.
func TestServerErrorIsRetried(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	rcv.answer = func(_ context.Context, _ request, n int) (int, string) {
		if n == 1 {
			return http.StatusInternalServerError, "temporarily broken"
		}
		return http.StatusOK, "ok"
	}
	ev := upsert("doc", 1)
	e.publish(ev, time.Now())
	m := e.run("notifier", testConfig(rcv.url("/hook")))
	reqs := rcv.requests()
	if len(reqs) != 2 || reqs[0].Status != 500 || reqs[1].Status != 200 || reqs[0].Attempt != "1" || reqs[1].Attempt != "2" {
		t.Fatalf("requests: %+v", reqs)
	}
	if perEffect := rcv.check(); len(perEffect) != 1 {
		t.Fatalf("%d keys for one effect", len(perEffect))
	}
	if reqs[0].Body != reqs[1].Body {
		t.Fatalf("the attempts sent different bodies: %+v %+v", reqs[0].Body, reqs[1].Body)
	}
	name := nameOf([]string{rcv.url("/hook")}, rcv.url("/hook"))
	if s, r := testutil.ToFloat64(m.Sent.WithLabelValues(name)), testutil.ToFloat64(m.Retried.WithLabelValues(name)); s != 1 || r != 1 {
		t.Fatalf("sent %v, retried %v; want 1 and 1", s, r)
	}
	if n := testutil.CollectAndCount(m.RequestSeconds); n != 1 {
		t.Fatalf("latency series: %d", n)
	}
	if dls := e.deadLetters("notifier"); len(dls) != 0 {
		t.Fatalf("%d dead letters", len(dls))
	}
}

// A receiver that does not answer within the HTTP timeout is retried too.
func TestTimeoutIsRetried(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	rcv.answer = func(ctx context.Context, _ request, n int) (int, string) {
		if n == 1 {
			<-ctx.Done() // until the notifier gives up
		}
		return http.StatusOK, "ok"
	}
	e.publish(upsert("doc", 1), time.Now())
	cfg := testConfig(rcv.url("/hook"))
	cfg.HTTPTimeout = 200 * time.Millisecond
	m := e.run("notifier", cfg)
	statuses := map[int]int{}
	for _, q := range rcv.requests() {
		statuses[q.Status]++
	}
	if len(rcv.requests()) != 2 || statuses[0] != 1 || statuses[200] != 1 {
		t.Fatalf("requests: %+v, want one timed out (status 0) and one answered 200", rcv.requests())
	}
	if r := testutil.ToFloat64(m.Retried.WithLabelValues(nameOf(cfg.URLs, rcv.url("/hook")))); r != 1 {
		t.Fatalf("retried %v", r)
	}
	rcv.check()
}

// After MaxAttempts failures the event goes to the notifier's dead-letter
// subject with the status and an excerpt of the answer; the target that
// answered is not sent to again; a redrive once the receiver is fixed
// sends the missing effect only, with the same key.
func TestGivingUpDeadLettersTheEvent(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	broken := true
	rcv.answer = func(_ context.Context, q request, _ int) (int, string) {
		if q.Path == "/broken" && broken {
			return http.StatusServiceUnavailable, "upstream down\n" + strings.Repeat("x", 2000)
		}
		return http.StatusOK, "ok"
	}
	ev := upsert("doc", 1)
	e.publish(ev, time.Now())
	cfg := testConfig(rcv.url("/ok"), rcv.url("/broken"))
	cfg.MaxAttempts = 3
	m := e.run("notifier", cfg)
	if a, b := rcv.count("/ok"), rcv.count("/broken"); a != 1 || b != 3 {
		t.Fatalf("requests: /ok %d, /broken %d; want 1 and 3", a, b)
	}
	dls := e.deadLetters("notifier")
	if len(dls) != 1 {
		t.Fatalf("%d dead letters", len(dls))
	}
	reason := dls[0].Header.Get(deadletter.HeaderReason)
	name := nameOf(cfg.URLs, rcv.url("/broken"))
	if dls[0].Header.Get(deadletter.HeaderCode) != DeadLetterCode || !strings.Contains(reason, "HTTP 503") ||
		!strings.Contains(reason, `upstream down\nxxx`) || !strings.Contains(reason, "webhook "+name+":") ||
		strings.Contains(reason, "webhook "+nameOf(cfg.URLs, rcv.url("/ok"))+":") {
		t.Fatalf("dead letter: code %q, reason %q", dls[0].Header.Get(deadletter.HeaderCode), reason)
	}
	if d, r := testutil.ToFloat64(m.DeadLettered.WithLabelValues(name)), testutil.ToFloat64(m.Retried.WithLabelValues(name)); d != 1 || r != 2 {
		t.Fatalf("dead-lettered %v, retried %v; want 1 and 2", d, r)
	}
	if _, err := e.record(EffectID(rcv.url("/broken"), ev.ID)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the dead effect's record was not reset: %v", err)
	}

	// Redrive, as converge dlq redrive does: the dead letter's data and
	// headers back on the original subject.
	rcv.mu.Lock()
	broken = false
	rcv.mu.Unlock()
	redrive := nats.NewMsg(dls[0].Header.Get(deadletter.HeaderSubject))
	redrive.Data = dls[0].Data
	redrive.Header.Set(contract.HeaderCommitTime, dls[0].Header.Get(contract.HeaderCommitTime))
	if _, err := e.js.PublishMsg(context.Background(), redrive); err != nil {
		t.Fatal(err)
	}
	e.run("notifier", cfg)
	if a, b := rcv.count("/ok"), rcv.count("/broken"); a != 1 || b != 4 {
		t.Fatalf("after the redrive: /ok %d, /broken %d; want 1 and 4", a, b)
	}
	if reqs := rcv.requests(); reqs[len(reqs)-1].Status != 200 || reqs[len(reqs)-1].Attempt != "1" {
		t.Fatalf("the redriven attempt: %+v", reqs[len(reqs)-1])
	}
	if perEffect := rcv.check(); len(perEffect) != 2 {
		t.Fatalf("%d keys for 2 effects", len(perEffect))
	}
}

// A slow receiver holds at most Concurrency requests and delays no other
// target: every notification reaches the fast one while the slow one has
// not answered once; each reaches the slow one once it answers.
func TestSlowReceiverDoesNotBlockOthers(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	release := make(chan struct{})
	rcv.answer = func(ctx context.Context, q request, _ int) (int, string) {
		if q.Path == "/slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return http.StatusOK, "ok"
	}
	const docs = 12
	for i := range docs {
		e.publish(upsert(fmt.Sprintf("doc-%d", i), 1), time.Now())
	}
	cfg := testConfig(rcv.url("/fast"), rcv.url("/slow"))
	cfg.Concurrency = 2
	cfg.SendWait = 50 * time.Millisecond
	cfg.HTTPTimeout = 30 * time.Second
	cfg.ClaimTimeout = time.Minute
	done := make(chan *Metrics)
	go func() { done <- e.run("notifier", cfg) }()
	testenv.Eventually(t, "every notification to reach the fast receiver, and the slow one to hold the concurrency", 20*time.Second, func() bool {
		rcv.mu.Lock()
		slow := rcv.inFlight["/slow"]
		rcv.mu.Unlock()
		return slow == 2 && rcv.count("/fast") == docs
	})
	if n := rcv.count("/slow"); n != 0 {
		t.Fatalf("/slow answered %d before it was released", n)
	}
	close(release)
	m := <-done
	if got := rcv.count("/slow"); got != docs {
		t.Fatalf("/slow got %d requests, want %d", got, docs)
	}
	rcv.mu.Lock()
	maxSlow := rcv.maxInFlight["/slow"]
	rcv.mu.Unlock()
	if maxSlow != 2 {
		t.Fatalf("/slow had up to %d requests in flight, want the concurrency, 2", maxSlow)
	}
	for key, n := range rcv.check() {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs", key, n)
		}
	}
	if n := testutil.ToFloat64(m.Sent.WithLabelValues(nameOf(cfg.URLs, rcv.url("/slow")))); n != docs {
		t.Fatalf("sent to /slow: %v", n)
	}
}

// A receiver holding the wrong secret rejects every request: the
// signature is not decorative.
func TestWrongSecretFailsVerification(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	rcv.secret = []byte("another secret")
	e.publish(upsert("doc", 1), time.Now())
	e.run("notifier", testConfig(rcv.url("/hook")))
	reqs := rcv.requests()
	if len(reqs) != 1 || reqs[0].Verified {
		t.Fatalf("requests: %+v", reqs)
	}
}

// The webhook carries the trace context of the write that made the event
// (tracing off here: passed on as the message had it), so that the
// receiver can continue the trace; an event without one sends none.
func TestWebhookCarriesTheEventsTraceContext(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for key, trace := range map[string]string{"traced": tp, "untraced": ""} {
		ev := upsert(key, 1)
		data, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(contract.Subject(ev.Key))
		m.Data = data
		m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
		if trace != "" {
			m.Header.Set("traceparent", trace)
		}
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	e.run("notifier", testConfig(rcv.url("/hook")))
	got := map[string]string{}
	for _, r := range rcv.requests() {
		got[r.Body.Key] = r.TraceParent
	}
	if len(got) != 2 || got["traced"] != tp || got["untraced"] != "" {
		t.Fatalf("traceparent by key: %q", got)
	}
}

// A send started under a lease term that has ended (projector.Writable
// false: the instance cut off from NATS while another takes over) claims
// nothing and posts nothing: the event is redelivered, to the next writer.
func TestSendOutsideItsTermPostsNothing(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	n := e.newNotifier(testConfig(rcv.url("/a")))
	ev := upsert("doc", 1)
	ended := projector.WithWritable(context.Background(), func() bool { return false })
	res := n.ApplyDeliveries(ended, []projector.Delivery{{Event: &ev, CommitTime: time.Now()}})
	var redeliver *projector.RedeliverError
	if !errors.As(res[0].Err, &redeliver) {
		t.Fatalf("result %+v, want a redelivery", res[0])
	}
	if got := len(rcv.requests()); got != 0 {
		t.Fatalf("%d requests sent outside the term, want 0", got)
	}
	if _, err := e.record(EffectID(rcv.url("/a"), ev.ID)); err == nil {
		t.Fatal("the effect was claimed outside the term")
	}
	live := projector.WithWritable(context.Background(), func() bool { return true })
	if res := n.ApplyDeliveries(live, []projector.Delivery{{Event: &ev, CommitTime: time.Now()}}); res[0].Err != nil {
		t.Fatalf("within a term: %v", res[0].Err)
	}
	if got := len(rcv.requests()); got != 1 {
		t.Fatalf("%d requests within the term, want 1", got)
	}
}
