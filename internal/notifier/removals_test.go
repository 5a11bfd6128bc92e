//go:build linux

package notifier

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// effectsChild is the value of childEnv that makes the test binary run the
// notifier on the effects' stream with the accounting tests' settings
// (accountingConfigs), for the webhook CONVERGE_WEBHOOK_URLS, until it is
// killed; it prints "consuming" once its consumer delivers.
const effectsChild = "effects"

func runEffectsChild() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	nc, err := nats.Connect(os.Getenv("CONVERGE_NATS_URL"))
	if err != nil {
		log.Error("nats", "err", err)
		return 2
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Error("jetstream", "err", err)
		return 2
	}
	cfg, rc := accountingConfigs(os.Getenv(EnvWebhookURLs))
	cfg.Owner = "child"
	n, err := New(context.Background(), js, cfg, nil, log)
	if err != nil {
		log.Error("notifier", "err", err)
		return 2
	}
	r, err := projector.New(js, n, rc, nil, log)
	if err != nil {
		log.Error("projector", "err", err)
		return 2
	}
	go func() {
		<-r.Ready()
		fmt.Println("consuming")
	}()
	if err := r.Run(context.Background()); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// A notifier is SIGKILLed while it holds events delivered and not
// acknowledged (in hand, handed back for a backoff), and none runs while
// the writes go on: the small effects' stream's size bound removes events
// of every kind, among them those the dead notifier held, which the
// server counts as acknowledged and which no consumer state shows. The
// next notifier reports them from the removals' stream, so that every
// event written is, in the end, received, dead-lettered or reported
// missed. The one over-report allowed: an event the dead notifier sent and
// did not acknowledge before it died, then removed.
func TestEventsRemovedAfterACrashAreReported(t *testing.T) {
	const (
		bound  = 24 << 10
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
	url := rcv.srv.URL + "/hook"

	// The child, consuming; the first half of the writes, at about twice
	// the rate the receiver takes them; the kill.
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+effectsChild, "CONVERGE_NATS_URL="+e.n.URL, EnvWebhookURLs+"="+url)
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	childLogs := &testenv.LockedBuffer{}
	child.Stderr = childLogs
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		if t.Failed() {
			t.Logf("the killed notifier's output:\n%s", childLogs.String())
		}
	})
	consuming := make(chan struct{})
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		if strings.TrimSpace(line) == "consuming" {
			close(consuming)
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-consuming:
	case <-time.After(30 * time.Second):
		t.Fatal("the notifier child did not start consuming within 30s")
	}
	var out []written
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			out = append(out, written{ev: all[i], seq: e.publishEffect(all[i])})
			if i%4 == 3 {
				time.Sleep(8 * time.Millisecond)
			}
		}
	}
	publish(0, events/2)
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	atKill := rcv.received()
	// The rest while no notifier runs: the bound removes what the child
	// held.
	publish(events/2, events)
	if s := e.streamState(contract.EventsStream); s.FirstSeq <= 1 {
		t.Fatalf("the stream's bound removed nothing (first sequence %d): the test tests nothing", s.FirstSeq)
	}

	// The next notifier, until every event is accounted for or the time
	// is up.
	reports := &missedReports{}
	metrics := projector.NewMetrics(nil, "notifier")
	cfg, rc := accountingConfigs(url)
	n, err := New(ctx, e.js, cfg, nil, slog.New(reports))
	if err != nil {
		t.Fatal(err)
	}
	r, err := projector.New(e.js, n, rc, metrics, slog.New(reports))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	gapRecord := func() projector.GapRecord {
		c, err := e.js.Consumer(ctx, contract.EventsStream, "notifier")
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := projector.ReadGapRecord(c.CachedInfo().Config.Metadata)
		return rec
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(rcv.received())+len(e.deadLetterSeqs("notifier"))+int(gapRecord().Missed) < events && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	testenv.Eventually(t, "the stream and the consumer to be empty", 10*time.Second, func() bool {
		c, err := e.js.Consumer(ctx, contract.EventsStream, "notifier")
		if err != nil {
			return false
		}
		info := c.CachedInfo()
		return e.streamState(contract.EventsStream).Msgs == 0 && info.NumPending == 0 && info.NumAckPending == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	_ = n.Close()

	received := rcv.received()
	dead := e.deadLetterSeqs("notifier")
	rec := gapRecord()
	receivedSeq := map[uint64]bool{}
	receivedAtKill := map[uint64]bool{}
	for _, w := range out {
		if received[w.ev.ID] > 0 {
			receivedSeq[w.seq] = true
		}
		if atKill[w.ev.ID] > 0 {
			receivedAtKill[w.seq] = true
		}
	}
	// Every report, the child's (from its log) and the next runtime's.
	all2 := append(childReports(t, childLogs.String()), reports.all()...)
	reported := map[uint64]bool{}
	var inReports, overReports, afterCrash uint64
	for _, rp := range all2 {
		inReports += rp.count
		if strings.Contains(rp.msg, "while no runtime of this consumer accounted for it") {
			afterCrash += rp.count
		}
		if rp.window {
			continue
		}
		for seq := rp.from; seq <= rp.to; seq++ {
			switch {
			case receivedSeq[seq] && receivedAtKill[seq] && strings.Contains(rp.msg, "while no runtime of this consumer accounted for it"):
				overReports++ // sent by the child, which died before its acknowledgement
			case receivedSeq[seq]:
				t.Errorf("false report: event %d was received and reported missed (%s)", seq, rp.msg)
			case dead[seq]:
				t.Errorf("false report: event %d was dead-lettered and reported missed (%s)", seq, rp.msg)
			case reported[seq]:
				t.Errorf("event %d reported missed twice", seq)
			}
			reported[seq] = true
		}
	}
	if inReports != rec.Missed {
		t.Errorf("the reports count %d missed, the gap record %d", inReports, rec.Missed)
	}
	var silent []string
	for _, w := range out {
		if !receivedSeq[w.seq] && !dead[w.seq] && !reported[w.seq] {
			silent = append(silent, strconv.FormatUint(w.seq, 10))
		}
	}
	sum := uint64(len(received)+len(dead)) + rec.Missed - overReports
	if len(silent) > 0 || sum != events {
		t.Fatalf("%d received + %d dead-lettered + %d reported missed - %d sent before the crash and reported = %d, want the %d written; neither received, dead-lettered nor reported: %s\nreports:\n%s",
			len(received), len(dead), rec.Missed, overReports, sum, events, strings.Join(silent, " "), reports.String())
	}
	if afterCrash == 0 {
		t.Fatalf("no event the dead notifier held was removed (nothing reported from the removals' stream): the test tests nothing\nreports:\n%s", reports.String())
	}
	t.Logf("%d written: %d received, %d dead-lettered, %d reported missed, %d of them from the removals' stream after the crash (%d of those sent before it); missed metric of the next runtime %v",
		events, len(received), len(dead), rec.Missed, afterCrash, overReports, testutil.ToFloat64(metrics.Missed))
}

// childReport matches a report of missed events in a child's text log.
var childReport = regexp.MustCompile(`msg="([^"]*)" missed=(\d+) from=(\d+) to=(\d+)`)

// childReports reads the reports of missed events from a child's log.
func childReports(t *testing.T, logs string) []missedReport {
	t.Helper()
	var out []missedReport
	var mu sync.Mutex
	for _, line := range strings.Split(logs, "\n") {
		m := childReport.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		count, _ := strconv.ParseUint(m[2], 10, 64)
		from, _ := strconv.ParseUint(m[3], 10, 64)
		to, _ := strconv.ParseUint(m[4], 10, 64)
		mu.Lock()
		out = append(out, missedReport{from: from, to: to, count: count, window: count != to-from+1, msg: m[1]})
		mu.Unlock()
	}
	return out
}
