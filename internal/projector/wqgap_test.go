package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// A takeover on a work-queue stream (the effects' stream): the new writer
// resets the consumer to its acknowledgement floor, as RunService does,
// while the previous writer acknowledged events above the floor, which a
// work queue deleted. Those were delivered and handled, not missed.
func TestNoFalseGapAfterATakeoverResetOnAWorkQueue(t *testing.T) {
	js, publish := workQueue(t)
	ctx := context.Background()
	for v := int64(1); v <= 10; v++ {
		publish("doc", v)
	}
	cfg := projector.Config{Name: "notifier", Stream: contract.EventsStream, SubjectPrefix: contract.EventsSubjectPrefix,
		EveryEvent: true, AckWait: time.Second, BatchSize: 4}
	// The first writer holds version 1 back (a slow receiver) and handles
	// the rest.
	first := &deliveryStore{answer: func(d projector.Delivery) error {
		if d.Event.Version == 1 {
			return projector.Redeliver(context.DeadlineExceeded, time.Hour)
		}
		return nil
	}}
	r1, err := projector.New(js, first, cfg, projector.NewMetrics(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := background(t, r1)
	testenv.Eventually(t, "the first writer to handle versions 2..10", 30*time.Second, func() bool { return len(first.versions("doc")) >= 10 })
	stop()

	// The takeover, as RunService does it: the consumer's state, then the
	// reset, then the next writer.
	logs := &testenv.Buffer{}
	metrics := projector.NewMetrics(nil)
	next := &deliveryStore{}
	r2, err := projector.New(js, next, cfg, metrics, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, contract.EventsStream, "notifier")
	if err != nil {
		t.Fatal(err)
	}
	r2.TookOver(cons.CachedInfo())
	if _, err := js.ResetConsumer(ctx, contract.EventsStream, "notifier"); err != nil {
		t.Fatal(err)
	}
	for v := int64(11); v <= 15; v++ {
		publish("doc", v)
	}
	stop = background(t, r2)
	testenv.Eventually(t, "the next writer to handle version 1 and 11..15", 30*time.Second, func() bool { return len(next.versions("doc")) >= 6 })
	time.Sleep(3 * cfg.AckWait) // past the gap detector's grace
	publish("doc", 16)          // a batch after the grace, which reports what is due
	testenv.Eventually(t, "the next writer to handle version 16", 30*time.Second, func() bool { return len(next.versions("doc")) >= 7 })
	stop()
	if n := testutil.ToFloat64(metrics.Missed); n != 0 || logs.Contains("never delivered") {
		t.Fatalf("the next writer reported %v events missed; every one was handled (first: %v, next: %v)\n%s", n, first.versions("doc"), next.versions("doc"), logs.String())
	}
}

// An event delivered and handed back unacknowledged (a slow receiver, a
// backoff), then removed by the stream's limits, is never delivered again:
// it is reported missed, by the runtime that handed it back and by one
// that starts after it.
func TestHandedBackEventRemovedByTheLimitsIsReported(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "same runtime"
		if restart {
			name = "next start"
		}
		t.Run(name, func(t *testing.T) {
			js, publish := workQueue(t)
			ctx := context.Background()
			publish("slow", 1)
			cfg := projector.Config{Name: "notifier", Stream: contract.EventsStream, SubjectPrefix: contract.EventsSubjectPrefix,
				EveryEvent: true, AckWait: 500 * time.Millisecond, BatchSize: 4}
			held := &deliveryStore{answer: func(d projector.Delivery) error {
				if d.Event.Key == "slow" {
					return projector.Redeliver(context.DeadlineExceeded, 3*time.Second)
				}
				return nil
			}}
			logs := &testenv.Buffer{}
			metrics := projector.NewMetrics(nil)
			r, err := projector.New(js, held, cfg, metrics, slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			stop := background(t, r)
			testenv.Eventually(t, "the slow event to be handed back", 10*time.Second, func() bool { return len(held.versions("slow")) >= 1 })
			if restart {
				// The next start, before the server delivers it again.
				stop()
				metrics = projector.NewMetrics(nil)
				r, err = projector.New(js, held, cfg, metrics, slog.New(slog.NewTextHandler(logs, nil)))
				if err != nil {
					t.Fatal(err)
				}
				stop = background(t, r)
				<-r.Ready() // it has read the consumer's state
			}
			// The stream removes it, as its age or size limit would.
			stream, err := js.Stream(ctx, contract.EventsStream)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.DeleteMsg(ctx, 1); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				publish(fmt.Sprintf("other-%d", i), 1)
			}
			testenv.Eventually(t, "the slow event to be reported missed", 20*time.Second, func() bool {
				if testutil.ToFloat64(metrics.Missed) > 0 {
					return true
				}
				publish("tick", time.Now().UnixNano()) // a batch, which reports what is due
				time.Sleep(200 * time.Millisecond)
				return false
			})
			stop()
			if n := testutil.ToFloat64(metrics.Missed); n != 1 {
				t.Fatalf("%v missed, want the 1 slow event\n%s", n, logs.String())
			}
			t.Logf("%s", lastLine(logs.String(), "never delivered again"))
		})
	}
}

// workQueue is a NATS server with the effects' stream, a work queue, and
// a function publishing an upserted event on it.
func workQueue(t *testing.T) (jetstream.JetStream, func(key string, version int64)) {
	t.Helper()
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: contract.EventsStream, Subjects: []string{contract.EventsSubjectPrefix + ">"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	return js, func(key string, version int64) {
		t.Helper()
		data, err := upsert(key, version).Encode()
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(contract.EventsSubjectPrefix + contract.SubjectToken(key))
		m.Data = data
		m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

func lastLine(s, containing string) string {
	out := ""
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, containing) {
			out = l
		}
	}
	return out
}
