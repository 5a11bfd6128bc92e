//go:build linux

package relay_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// When the NATS server's disk fills, JetStream stores nothing more in the
// stream (and answers no publish), and goes on so once the disk has room
// again, until it is restarted, while its own health check stays green.
// The relays say so, though they take the slot in turn as each session
// fails: one reports itself not ready, naming the error. After
// the server restarts on its store, every event reaches the stream once.
func TestRelaySaysWhenJetStreamCannotStore(t *testing.T) {
	// Its own NATS server, and a database of the shared cluster (which
	// only tests that run alone restart) with a slot of its own name:
	// the cluster's slot names are one namespace, and
	// TestRelaySurvivesRepeatedSIGKILL, parallel too, takes the default.
	t.Parallel()
	disk, err := testenv.MountDisk(t, "64m")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	n, err := testenv.StartNATSAt(disk.Dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown() })
	f := newFixtureWith(t, pg.MigratedDatabase(t), n)
	metrics := relay.NewMetrics(nil)
	// A missing acknowledgement ends a session after 1 s rather than the
	// default 5 s: the sessions that fail on the full disk, and the
	// standby's turns between them, come five times as fast.
	cfg := relay.Config{Slot: "disk_full", StandbyRetry: 100 * time.Millisecond, AckTimeout: time.Second,
		Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}}
	r, stop := f.runWith(t, cfg, metrics, nil)
	defer stop()
	// A standby, which takes the slot in turn while the sessions fail.
	standbyMetrics := relay.NewMetrics(nil)
	standby, stopStandby := f.runWith(t, cfg, standbyMetrics, nil)
	defer stopStandby()
	failing := func() error {
		if err := r.Publishing(context.Background()); err != nil {
			return err
		}
		return standby.Publishing(context.Background())
	}
	f.write(t, 0, 20, 1)
	testenv.Eventually(t, "20 events in the stream", 20*time.Second, func() bool {
		return streamInfo(t, f.js, contract.DocsStream).State.Msgs == 20
	})
	if err := failing(); err != nil {
		t.Fatalf("publishing reported failing while it works: %v", err)
	}

	if _, err := disk.Fill(); err != nil {
		t.Fatal(err)
	}
	f.write(t, 20, 40, 1)
	testenv.Eventually(t, "the relay to report that publishing fails", 30*time.Second, func() bool {
		err := failing()
		return err != nil && strings.Contains(err.Error(), "no acknowledgement")
	})
	failedSessions := func() float64 {
		return testutil.ToFloat64(metrics.SessionErrors.WithLabelValues("publish")) +
			testutil.ToFloat64(standbyMetrics.SessionErrors.WithLabelValues("publish"))
	}
	if err := disk.Free(); err != nil {
		t.Fatal(err)
	}
	// Room again, and still refused: the server keeps its write error.
	// Three more sessions fail: the one under way when the disk was
	// freed, and at least two begun on a disk with room (as many as the
	// 2*PublishAlarm this used to sleep gave with the default 5 s
	// AckTimeout).
	freed := failedSessions()
	testenv.Eventually(t, "two sessions begun after the disk was freed to fail", 30*time.Second, func() bool {
		return failedSessions() >= freed+3
	})
	if err := failing(); err == nil {
		t.Fatal("publishing reported working again before the NATS server restarted")
	}

	// The operator restarts the server on its store.
	port := n.Port
	n.Shutdown()
	n2, err := testenv.StartNATSAt(disk.Dir, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n2.Shutdown() })
	testenv.Eventually(t, "all 40 events in the stream after the restart", 60*time.Second, func() bool {
		info, err := f.js.Stream(context.Background(), contract.DocsStream)
		if err != nil {
			return false
		}
		st, err := info.Info(context.Background())
		return err == nil && st.State.Msgs == 40
	})
	// The relay that stood by while the other stored the events again
	// forgets its failure a few sessions later.
	testenv.Eventually(t, "the relays to report publishing again", 45*time.Second, func() bool {
		return failing() == nil && testutil.ToFloat64(metrics.PublishFailing) == 0
	})
	seen := map[string]bool{}
	readStream(t, f.js, func(m jetstream.Msg, _ contract.Event) { seen[m.Headers().Get(jetstream.MsgIDHeader)] = true })
	if len(seen) != 40 {
		t.Fatalf("%d distinct events in the stream, want 40", len(seen))
	}
}
