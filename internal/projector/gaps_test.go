package projector_test

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// newLimitedEnv is an env whose stream keeps two versions per document.
func newLimitedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	if _, err := e.js.UpdateStream(context.Background(), jetstream.StreamConfig{Name: contract.DocsStream,
		Subjects: []string{contract.DocsSubjectPrefix + ">"}, Storage: jetstream.FileStorage, MaxMsgsPerSubject: 2}); err != nil {
		t.Fatal(err)
	}
	return e
}

// runEvery runs an EveryEvent runtime until it has caught up, and returns
// it, its metrics and its log.
func runEvery(t *testing.T, e *env, name string, store projector.Store) (*projector.Runtime, *projector.Metrics, *testenv.Buffer) {
	t.Helper()
	return runEveryOn(t, e, name, store, nil)
}

// runEveryOn is runEvery with the runtime's wall clock c (nil: the
// system's).
func runEveryOn(t *testing.T, e *env, name string, store projector.Store, c clock.Clock) (*projector.Runtime, *projector.Metrics, *testenv.Buffer) {
	t.Helper()
	logs := &testenv.Buffer{}
	metrics := projector.NewMetrics(nil)
	r, err := projector.New(e.js, store, projector.Config{Name: name, EveryEvent: true, StopWhenCaughtUp: true, BatchSize: 16, Clock: c},
		metrics, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the projector did not catch up within 30s")
	}
	return r, metrics, logs
}

func storedGapRecord(t *testing.T, e *env, name string) (projector.GapRecord, bool) {
	t.Helper()
	return projector.ReadGapRecord(consumerConfig(t, e.js, name).Metadata)
}

// The time of the last gap, which converge status shows beside those
// other services wrote, is read from the runtime's wall clock, not the
// machine's: here two hours behind.
func TestGapTimeIsTheRuntimesClock(t *testing.T) {
	e := newLimitedEnv(t)
	e.publish(t, upsert("doc", 1))
	store := &deliveryStore{}
	runEvery(t, e, "effects", store)
	for v := int64(2); v <= 6; v++ { // sequences 2..6; 2..4 are purged
		e.publish(t, upsert("doc", v))
	}
	behind := 2 * time.Hour
	r, _, _ := runEveryOn(t, e, "effects", store, clock.NewShifted(-behind))
	rec := r.LastGap()
	if rec.Missed != 3 {
		t.Fatalf("last gap %+v, want 3 missed", rec)
	}
	if off := time.Since(rec.At); off < behind-time.Minute || off > behind+time.Minute {
		t.Fatalf("the gap is stamped %v, %v before the machine's clock; want the runtime's, %v behind", rec.At, off, behind)
	}
	if stored, ok := storedGapRecord(t, e, "effects"); !ok || !stored.At.Equal(rec.At) {
		t.Fatalf("consumer metadata holds %+v (%v), want the gap of %v", stored, ok, rec.At)
	}
}

// Versions pushed out of the stream by newer ones while the consumer was
// behind (here: stopped) are counted, logged with their range, and
// recorded in the consumer's metadata; the record outlives a restart.
func TestGapIsReported(t *testing.T) {
	e := newLimitedEnv(t)
	e.publish(t, upsert("doc", 1)) // sequence 1
	store := &deliveryStore{}
	_, metrics, _ := runEvery(t, e, "effects", store)
	if n := testutil.ToFloat64(metrics.Missed); n != 0 {
		t.Fatalf("%v missed before any gap, want 0", n)
	}
	for v := int64(2); v <= 6; v++ { // sequences 2..6; 2..4 are purged
		e.publish(t, upsert("doc", v))
	}
	r, metrics, logs := runEvery(t, e, "effects", store)
	if n := testutil.ToFloat64(metrics.Missed); n != 3 {
		t.Fatalf("%v missed, want 3", n)
	}
	if want := "events with stream sequences 2..4 were never delivered: the stream's limits (its per-subject history, age or size) removed them before this consumer read them"; !logs.Contains(want) {
		t.Fatalf("the log does not name the range: want %q in\n%s", want, logs.String())
	}
	if !logs.Contains("level=ERROR") {
		t.Fatal("the gap is not logged at error level")
	}
	if got := store.versions("doc"); len(got) != 3 || got[0] != 1 || got[1] != 5 || got[2] != 6 {
		t.Fatalf("the store received versions %v, want 1, 5, 6", got)
	}
	if rec := r.LastGap(); rec.Missed != 3 || rec.LastFrom != 2 || rec.LastTo != 4 || rec.At.IsZero() {
		t.Fatalf("last gap %+v, want 3 missed, 2..4", rec)
	}
	rec, ok := storedGapRecord(t, e, "effects")
	if !ok || rec.Missed != 3 || rec.LastFrom != 2 || rec.LastTo != 4 {
		t.Fatalf("consumer metadata holds %+v (%v), want 3 missed, 2..4", rec, ok)
	}

	// A later gap adds to the record the consumer keeps.
	for v := int64(7); v <= 10; v++ { // sequences 7..10; 7 and 8 are purged
		e.publish(t, upsert("doc", v))
	}
	r, metrics, _ = runEvery(t, e, "effects", store)
	if n := testutil.ToFloat64(metrics.Missed); n != 2 {
		t.Fatalf("%v missed by the third run, want 2", n)
	}
	if rec, ok := storedGapRecord(t, e, "effects"); !ok || rec.Missed != 5 || rec.LastFrom != 7 || rec.LastTo != 8 || !reflect.DeepEqual(r.LastGap(), rec) {
		t.Fatalf("consumer metadata holds %+v (%v), runtime %+v; want 5 missed, last 7..8", rec, ok, r.LastGap())
	}
}

// Events purged before a consumer existed are no gap of it: a brand-new
// consumer starts at the stream's first sequence, and so does a replay
// from an older one. Nor is a stream with nothing purged, nor an event
// redelivered after later versions were acknowledged.
func TestNoFalseGap(t *testing.T) {
	e := newLimitedEnv(t)
	for v := int64(1); v <= 5; v++ { // sequences 1..5; 1..3 are purged
		e.publish(t, upsert("doc", v))
	}
	e.publish(t, upsert("other", 1))
	store := &deliveryStore{}
	r, metrics, logs := runEvery(t, e, "fresh", store)
	if n := testutil.ToFloat64(metrics.Missed); n != 0 || r.LastGap().Missed != 0 || logs.Contains("never delivered") {
		t.Fatalf("a brand-new consumer reported %v missed (%+v)", n, r.LastGap())
	}
	if got := store.versions("doc"); len(got) != 2 || got[0] != 4 || got[1] != 5 {
		t.Fatalf("the store received versions %v, want 4, 5", got)
	}
	if _, ok := storedGapRecord(t, e, "fresh"); ok {
		t.Fatal("a gap record was saved without a gap")
	}

	if _, err := projector.Replay(context.Background(), e.js, contract.DocsStream, "fresh", projector.ReplayFrom{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if r, metrics, _ := runEvery(t, e, "fresh", &deliveryStore{}); testutil.ToFloat64(metrics.Missed) != 0 || r.LastGap().Missed != 0 {
		t.Fatalf("a replay from before the stream's first sequence reported %v missed", testutil.ToFloat64(metrics.Missed))
	}

	// Version 1 of "late" is asked back once, with a delay, while its
	// later versions are acknowledged: the acknowledgement floor stays
	// behind them when the runtime stops. Its restart is no gap either.
	e2 := newEnv(t)
	for v := int64(1); v <= 3; v++ {
		e2.publish(t, upsert("late", v))
	}
	asked := false
	redeliver := &deliveryStore{answer: func(d projector.Delivery) error {
		if d.Event.Version == 1 && !asked {
			asked = true
			return projector.Redeliver(context.DeadlineExceeded, 2*time.Second)
		}
		return nil
	}}
	logs = &testenv.Buffer{}
	metrics = projector.NewMetrics(nil)
	rr, err := projector.New(e2.js, redeliver, projector.Config{Name: "late", EveryEvent: true}, metrics, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	stop := background(t, rr)
	deadline := time.Now().Add(10 * time.Second)
	for len(redeliver.versions("late")) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if floor := consumerInfo(t, e2.js, "late").AckFloor.Stream; floor != 0 {
		t.Fatalf("ack floor %d, want 0 (version 1 unacknowledged)", floor)
	}
	e2.publish(t, upsert("late", 4))
	if r, metrics, logs := runEvery(t, e2, "late", redeliver); testutil.ToFloat64(metrics.Missed) != 0 || logs.Contains("never delivered") {
		t.Fatalf("a restart with acknowledgements above the floor reported %v missed (%+v)", testutil.ToFloat64(metrics.Missed), r.LastGap())
	}
}

func consumerInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), contract.DocsStream, name)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo()
}

// A version the stream's limits purge while the runtime is busy is a gap,
// reported while the runtime runs once twice the acknowledgement wait has
// passed without the server delivering it.
func TestGapReportedWhileRunning(t *testing.T) {
	e := newLimitedEnv(t)
	started, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	store := &deliveryStore{answer: func(d projector.Delivery) error {
		if d.Event.Version == 1 {
			once.Do(func() { close(started); <-release })
		}
		return nil
	}}
	logs := &testenv.Buffer{}
	metrics := projector.NewMetrics(nil)
	r, err := projector.New(e.js, store, projector.Config{Name: "effects", EveryEvent: true, BatchSize: 1, AckWait: time.Second, LagInterval: 200 * time.Millisecond},
		metrics, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer background(t, r)()
	defer unblock() // before the runtime is stopped
	e.publish(t, upsert("doc", 1))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("version 1 not applied within 10s")
	}
	// While it is, 19 more: the consumer delivers at most 4 unacknowledged,
	// the stream keeps 2 versions, so most are purged before delivery.
	for v := int64(2); v <= 20; v++ {
		e.publish(t, upsert("doc", v))
	}
	unblock()
	testenv.Eventually(t, "version 20 applied", 10*time.Second, func() bool {
		vs := store.versions("doc")
		return len(vs) > 0 && vs[len(vs)-1] == 20
	})
	testenv.Eventually(t, "the purged versions reported while the runtime runs", 10*time.Second, func() bool {
		return testutil.ToFloat64(metrics.Missed) > 0
	})
	applied := len(store.versions("doc"))
	if missed := int(testutil.ToFloat64(metrics.Missed)); missed+applied != 20 {
		t.Fatalf("%d missed and %d applied; want 20 in all", missed, applied)
	}
	if !logs.Contains("were never delivered") {
		t.Fatalf("no gap logged:\n%s", logs.String())
	}
}
