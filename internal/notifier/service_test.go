package notifier

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/testenv"
)

// Run, as the notifier command runs it: it notifies from the effects'
// stream, and /metrics serves the notifier's metrics beside the runtime's.
func TestRunServesMetrics(t *testing.T) {
	e := newRelayedEnv(t, 1, -1)
	rcv := newReceiver(t)
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	svc := stacktest.Start(t, ServiceConfig{
		Projector: projector.ServiceConfig{NATSURL: e.n.URL, MetricsAddr: addr, Runtime: projector.Config{Name: "notifier"}},
		Notifier:  testConfig(rcv.url("/hook")),
	}, Run)
	e.relayPublish(upsert("doc", 1), true)
	e.relayPublish(upsert("doc", 2), true)
	testenv.Eventually(t, "both versions to be notified", 20*time.Second, func() bool { return len(rcv.requests()) == 2 })
	var metrics string
	testenv.Eventually(t, "/metrics to count them", 20*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return strings.Contains(metrics, `converge_notifier_sent_total{target="`+nameOf([]string{rcv.url("/hook")}, rcv.url("/hook"))+`"} 2`) &&
			strings.Contains(metrics, `converge_projector_events_total{projector="notifier",result="applied"} 2`)
	})
	for _, name := range []string{"converge_notifier_request_seconds_bucket", "converge_notifier_requests_in_flight"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	for key, n := range rcv.check() {
		if n != 1 {
			t.Errorf("effect %s: %d POSTs", key, n)
		}
	}
	if err := svc.Stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}
