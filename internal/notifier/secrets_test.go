package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// The credentials of the webhook URLs of TestWebhookSecretsNeverLeave:
// a token in the path (as Slack's and Discord's webhooks carry theirs), a
// user and a password, a token in the query. None may appear anywhere the
// notifier writes or answers.
const (
	secretPath     = "p4thT0kenS3cret"
	secretUser     = "hookUs3rS3cret"
	secretPassword = "pa55w0rdS3cret"
	secretQuery    = "qu3ryT0kenS3cret"
)

var webhookSecrets = []string{secretPath, secretUser, secretPassword, secretQuery}

// otlpCollector receives the spans the OTLP/HTTP exporter sends: the raw
// requests (every attribute, event and status, as exported) and the
// decoded spans.
type otlpCollector struct {
	mu    sync.Mutex
	raw   [][]byte
	spans []exportedSpan
}

type exportedSpan struct {
	name  string
	attrs map[string]string
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.raw = append(c.raw, body)
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				es := exportedSpan{name: s.Name, attrs: map[string]string{}}
				for _, a := range s.Attributes {
					es.attrs[a.Key] = a.Value.GetStringValue()
				}
				c.spans = append(c.spans, es)
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// leakCheck fails the test for every text that holds a secret.
type leakCheck struct {
	t       *testing.T
	checked int
}

func (l *leakCheck) check(where, text string) {
	l.t.Helper()
	l.checked++
	for _, s := range webhookSecrets {
		if i := strings.Index(text, s); i >= 0 {
			l.t.Errorf("%s holds the secret %q: %q", where, s, text[max(0, i-100):min(len(text), i+len(s)+40)])
		}
	}
}

func (l *leakCheck) checkErr(where string, err error) {
	l.t.Helper()
	if err == nil {
		l.t.Errorf("%s: no error", where)
		return
	}
	l.check(where, err.Error())
}

// A notifier whose webhook URLs carry a token in their path and query and
// a user and password sends, retries, dead-letters and fails to connect,
// and rejects URLs it cannot parse, without any of them reaching its logs,
// its /metrics, its effect records, its dead letters, its spans or its
// errors.
func TestWebhookSecretsNeverLeave(t *testing.T) {
	leaks := &leakCheck{t: t}
	creds := secretUser + ":" + secretPassword + "@"

	// URLs refused by the configuration, whichever way it is read.
	unparseable := []string{
		"https://" + creds + "hooks.example.com:80x/services/T000/B000/" + secretPath,    // an invalid port
		"https://" + secretUser + ":" + secretPassword + "/x@hooks.example.com/services", // the password taken for a port
		"https://" + creds + "hooks.example.com/services/" + secretPath + "\x7f",         // a control character
		"https://" + creds + "hooks.example.com/services/%zz" + secretPath,               // an invalid escape
		creds + "hooks.example.com/services/" + secretPath,                               // no scheme
		"https://" + creds + "hooks.example.com/services/" + secretPath + "?token=" + secretQuery,
		"https://" + creds + "hooks.example.com/services/" + secretPath + "?token=" + secretQuery, // twice
	}
	bad := testConfig(unparseable...)
	leaks.checkErr("Validate", bad.Validate())
	e := newRelayedEnv(t, 1, -1)
	_, err := New(context.Background(), e.js, testConfig(unparseable...), nil, nil)
	leaks.checkErr("New", err)
	t.Setenv(EnvWebhookURLs, strings.Join(unparseable, ","))
	t.Setenv(EnvWebhookSecret, string(testSecret))
	f := config.NewFlags("notifier")
	get := Flags(f)
	if err = f.Parse(nil); err == nil {
		_, err = get()
	}
	leaks.checkErr("Flags", err)

	// Spans go to an OTLP collector in this process.
	col := &otlpCollector{}
	otlp := httptest.NewServer(col)
	defer otlp.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	stopTracing, err := telemetry.StartTracing(context.Background(), "converge-notifier", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stopTracing(context.Background()) }()

	// The receiver answers like an Express app: a 500 quotes the path.
	rcv := newReceiver(t)
	rcv.answer = func(_ context.Context, q request, n int) (int, string) {
		switch {
		case strings.HasSuffix(q.Path, "-flaky") && n == 1, strings.HasSuffix(q.Path, "-dead"):
			return http.StatusInternalServerError, "Cannot POST " + q.Path
		}
		return http.StatusOK, "ok"
	}
	closed, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(rcv.srv.URL, "http://")
	urls := []string{
		"http://" + creds + host + "/services/T000/B000/" + secretPath + "-ok?token=" + secretQuery,
		"http://" + creds + host + "/services/T000/B000/" + secretPath + "-flaky",
		"http://" + creds + host + "/services/T000/B000/" + secretPath + "-dead#" + secretQuery,
		"http://" + creds + closed + "/hooks/" + secretPath + "-refused",
	}
	logs := &testenv.LockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := testConfig(urls...)
	cfg.MaxAttempts = 3

	// The results of one delivery, as the runtime gets them.
	direct := cfg
	direct.Bucket = "SECRETS_DIRECT"
	n, err := New(context.Background(), e.js, direct, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ev := upsert("direct", 1)
	for _, res := range n.ApplyDeliveries(context.Background(), []projector.Delivery{{Event: &ev, CommitTime: time.Now()}}) {
		leaks.checkErr("a delivery's result", res.Err)
	}
	_ = n.Close()

	// Every record the notifier writes, including those it deletes.
	kv, err := e.js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: DefaultBucket, History: 1,
		TTL: DefaultWindow + DefaultClockSkew, Storage: jetstream.FileStorage, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := kv.WatchAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watcher.Stop() }()
	var recMu sync.Mutex
	var records []jetstream.KeyValueEntry
	go func() {
		for entry := range watcher.Updates() {
			if entry != nil {
				recMu.Lock()
				records = append(records, entry)
				recMu.Unlock()
			}
		}
	}()

	// The service as the binary runs it, on one traced event.
	ev = upsert("doc", 1)
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(contract.EventsSubject(ev.Key))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, ev.ID.String())
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	m.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	metricsAddr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	sc := ServiceConfig{
		Projector: projector.ServiceConfig{NATSURL: e.n.URL, MetricsAddr: metricsAddr, Runtime: projector.Config{Name: "notifier",
			RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}},
		Notifier: cfg,
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- service.Run(ctx, sc, log, Run) }()
	testenv.Eventually(t, "the event to be dead-lettered", 30*time.Second, func() bool {
		_, err := e.js.Stream(context.Background(), deadletter.Stream) // the runtime creates it
		return err == nil && len(e.deadLetters("notifier")) == 1
	})
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	leaks.check("Run's error", errorText(<-ran))

	info, err := e.js.Stream(context.Background(), "KV_"+DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	last := info.CachedInfo().State.LastSeq
	testenv.Eventually(t, "the watcher to see every record", 10*time.Second, func() bool {
		recMu.Lock()
		defer recMu.Unlock()
		return len(records) > 0 && records[len(records)-1].Revision() >= last
	})
	if err := stopTracing(context.Background()); err != nil {
		t.Fatal(err)
	}

	// What was sent: the successes, a retry, a dead letter, a refusal.
	if got := rcv.count("/services/T000/B000/" + secretPath + "-ok"); got != 2 {
		t.Errorf("%d requests to the answering target, want 2 (the direct delivery's and the service's)", got)
	}
	if got := rcv.count("/services/T000/B000/" + secretPath + "-dead"); got != 1+3 {
		t.Errorf("%d requests to the failing target, want 4 (1 direct, 3 attempts)", got)
	}

	text := string(metrics)
	for _, series := range []string{"converge_notifier_sent_total{", "converge_notifier_retried_total{",
		"converge_notifier_dead_lettered_total{", "converge_notifier_request_seconds_count{"} {
		if !strings.Contains(text, series) {
			t.Errorf("/metrics has no %s series", series)
		}
	}
	leaks.check("/metrics", text)

	logText := logs.String()
	for _, want := range []string{"notification failed; retrying", "notification given up", `"target":"http://`} {
		if !strings.Contains(logText, want) {
			t.Errorf("the log never says %q", want)
		}
	}
	for line := range strings.SplitSeq(strings.TrimSpace(logText), "\n") {
		leaks.check("a log line", line)
	}

	recMu.Lock()
	if len(records) < 8 {
		t.Errorf("%d effect records written, want at least 8 (claims, failures, sends)", len(records))
	}
	for _, r := range records {
		leaks.check("effect record "+r.Key(), string(r.Value()))
	}
	recMu.Unlock()
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		entry, err := kv.Get(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		var rec record
		if err := json.Unmarshal(entry.Value(), &rec); err != nil || rec.Target == "" {
			t.Errorf("record %s: %q %v", k, entry.Value(), err)
		}
		leaks.check("effect record "+k, string(entry.Value()))
	}

	dls := e.deadLetters("notifier")
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	t.Logf("the dead letter's reason: %s", dls[0].Header.Get(deadletter.HeaderReason))
	leaks.check("the dead letter's data", string(dls[0].Data))
	for name, values := range dls[0].Header {
		leaks.check("the dead letter's header "+name, name+": "+strings.Join(values, ", "))
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	posts := 0
	for _, s := range col.spans {
		if s.name == "webhook POST" {
			posts++
			if s.attrs["converge.target"] == "" {
				t.Errorf("a webhook span without its target: %v", s.attrs)
			}
		}
	}
	if posts < 1+2+3+3 {
		t.Errorf("%d webhook spans exported, want at least 9 (one per attempt)", posts)
	}
	for _, body := range col.raw {
		leaks.check("exported spans", string(body))
	}
	t.Logf("%d texts checked", leaks.checked)
}

func errorText(err error) string {
	if err == nil || errors.Is(err, context.Canceled) {
		return ""
	}
	return err.Error()
}

// A record written before the target names left out the path (a failed
// attempt, its backoff still running) quotes the path in its last failure;
// the error that reports the wait does not.
func TestOlderRecordsPathIsNotQuoted(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	u := rcv.url("/services/T000/B000/" + secretPath)
	n := e.newNotifier(testConfig(u))
	ev := upsert("doc", 1)
	now := time.Now()
	old := record{State: stateFailed, Attempts: 1, At: now, Next: now.Add(time.Hour), Owner: "before", EventID: ev.ID.String(),
		Target: rcv.srv.URL + "/services/T000/B000/" + secretPath, Last: "webhook " + u + ": HTTP 500"}
	if _, err := n.kv.Create(context.Background(), EffectID(u, ev.ID).String(), old.encode()); err != nil {
		t.Fatal(err)
	}
	res := n.ApplyDeliveries(context.Background(), []projector.Delivery{{Event: &ev, CommitTime: now}})
	var redeliver *projector.RedeliverError
	if !errors.As(res[0].Err, &redeliver) || !strings.Contains(res[0].Err.Error(), "attempt 1 of") {
		t.Fatalf("result %+v, want a redelivery after the backoff", res[0])
	}
	(&leakCheck{t: t}).check("the result", res[0].Err.Error())
	if got := len(rcv.requests()); got != 0 {
		t.Fatalf("%d requests during the backoff", got)
	}
}
