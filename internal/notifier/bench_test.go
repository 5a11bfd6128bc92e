package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// The per-request work of the hot path: the body and its signature.
func BenchmarkEncodeAndSign(b *testing.B) {
	ev := upsert("docs/benchmark", 42)
	effect := EffectID("https://receiver.example/hooks/converge", ev.ID)
	b.ReportAllocs()
	for b.Loop() {
		body, err := encodeNotification(effect, &ev)
		if err != nil {
			b.Fatal(err)
		}
		_ = Sign(testSecret, "1700000000", body)
	}
}

const (
	// envBenchEffects overrides the effects of one round.
	envBenchEffects     = "CONVERGE_BENCH_EFFECTS"
	defaultBenchEffects = 20000
	// writerBenchDocs is how many single-document PUTs one round sends to
	// the writer: at ~1-2k docs/s on two cores, a few seconds.
	writerBenchDocs = 5000
	// writerBenchClients is cmd/converge's latencyWorkers: the concurrent
	// clients of its single-document capacity run.
	writerBenchClients = 32
	// writerSeedDocs gives the writer's tables rows and statistics before
	// it is measured, as in a live database (see docstore's BenchmarkApply).
	writerSeedDocs = 2000
)

// BenchmarkNotifier measures, in one run on one machine:
//
//   - effects/s: effects through the whole protocol (claim in the dedup
//     bucket, signed POST, mark "sent") of events prefilled in the effects'
//     stream (CONVERGE_EVENTS, as the relay makes it), delivered by the
//     projector runtime to a Notifier, until every effect is sent and every
//     message acknowledged;
//   - plain_posts/s: the same number of the same POSTs (the notifier's own
//     encoding, signature, request and client, at the same concurrency)
//     without the protocol: no NATS, no claim, no mark;
//   - writer_single_docs/s: the writer's HTTP API over a real Postgres,
//     one document per PUT from 32 clients (cmd/converge's single-document
//     capacity run, without the projections), so that keeps_up, effects/s
//     over it, says whether one webhook URL keeps up with a writer taking
//     single-document writes (>= 1: it does). The sides run one after the
//     other, each with the machine to itself.
//
// The notifier runs with its defaults (Concurrency 8, SendWait 2s, the
// default HTTP client) and the runtime with the notifier service's
// (RuntimeConfig over batch 256, 2 shards, AckWait 60s), as deployed: a
// receiver that answers at once never makes SendWait matter. One round per iteration, each with
// CONVERGE_BENCH_EFFECTS (default 20,000) fresh events; the notifier and
// the plain POSTs alternate which goes first. The receiver answers 200 at
// once and verifies every signature; a round fails unless each effect
// arrived exactly once and the consumer acknowledged every message.
// Absolute figures are the machine's (and its load's): compare the ratios.
func BenchmarkNotifier(b *testing.B) {
	n := defaultBenchEffects
	if v := os.Getenv(envBenchEffects); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive number of effects", envBenchEffects, v)
		}
	}
	ctx := context.Background()
	e := newBenchNATS(b)
	recv := newBenchReceiver(b)
	notifierURL, plainURL := recv.url("/hooks/notifier"), recv.url("/hooks/plain")
	w := startBenchWriter(b)

	var notifierTime, plainTime, writerTime time.Duration
	var effects, posts, writes int
	round := 0
	for b.Loop() {
		b.StopTimer()
		run := fmt.Sprintf("r%d", round)
		evs := benchEvents(run, n)
		e.prefill(b, evs)
		b.StartTimer()

		notify := func() {
			d := e.notify(b, notifierURL, recv, evs)
			notifierTime += d
			effects += n
		}
		plain := func() {
			d := plainPosts(b, plainURL, recv, evs)
			plainTime += d
			posts += n
		}
		if round%2 == 0 {
			notify()
			plain()
		} else {
			plain()
			notify()
		}
		writerTime += w.putSingles(ctx, b, "w"+run, writerBenchDocs)
		writes += writerBenchDocs
		round++
	}

	effectRate := float64(effects) / notifierTime.Seconds()
	plainRate := float64(posts) / plainTime.Seconds()
	writerRate := float64(writes) / writerTime.Seconds()
	b.ReportMetric(effectRate, "effects/s")
	b.ReportMetric(plainRate, "plain_posts/s")
	b.ReportMetric(effectRate/plainRate, "ratio")
	b.ReportMetric(writerRate, "writer_single_docs/s")
	b.ReportMetric(effectRate/writerRate, "keeps_up")
	b.Logf("notifier: %.0f effects/s through claim, send and mark; the same POSTs without the protocol %.0f/s (ratio %.2f); "+
		"writer %.0f single-document PUTs/s (keeps_up %.2f); %d round(s) of %d effects, %d PUTs",
		effectRate, plainRate, effectRate/plainRate, writerRate, effectRate/writerRate, round, n, writerBenchDocs)
	benchsummary.Log(b, benchsummary.Row{Target: "notifier effects / the writer's single-document PUTs",
		Figure: fmt.Sprintf("%.0f effects/s", effectRate), Limit: fmt.Sprintf("%.0f PUTs/s", writerRate), Ratio: effectRate / writerRate,
		Goal: ">= 1 (keeps up)", Met: effectRate >= writerRate})
}

// benchNATS is an embedded JetStream server holding the streams as the
// relay makes them with effects on; the notifier consumes the effects'
// stream.
type benchNATS struct {
	js      jetstream.JetStream
	lastSeq uint64 // of the last prefill
}

// benchConsumer is the notifier's durable consumer in the benchmark: the
// same across rounds, so that each round consumes the events prefilled
// for it.
const benchConsumer = "notifier"

func newBenchNATS(b *testing.B) *benchNATS {
	b.Helper()
	js, err := jetstream.New(testenv.StartNATS(b).Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg := relay.Config{Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.EnsureStream(context.Background(), js, cfg.Stream); err != nil {
		b.Fatal(err)
	}
	if _, err := relay.EnsureEffectsStream(context.Background(), js, cfg); err != nil {
		b.Fatal(err)
	}
	return &benchNATS{js: js}
}

// prefill stores evs in the effects' stream as the relay does (the event
// id as Nats-Msg-Id, the commit time header), before the notifier starts.
// The documents' stream, which the notifier does not read, is left empty.
func (e *benchNATS) prefill(b *testing.B, evs []contract.Event) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	committed := time.Now().UTC().Format(time.RFC3339Nano)
	const window = 1024 // acknowledgements awaited at once
	futures := make([]jetstream.PubAckFuture, 0, window)
	wait := func() {
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				e.lastSeq = max(e.lastSeq, ack.Sequence)
			case err := <-f.Err():
				b.Fatalf("prefill: %v", err)
			case <-ctx.Done():
				b.Fatal("prefill: no acknowledgement within 2m")
			}
		}
		futures = futures[:0]
	}
	for i := range evs {
		data, err := evs[i].Encode()
		if err != nil {
			b.Fatal(err)
		}
		m := nats.NewMsg(contract.EventsSubject(evs[i].Key))
		m.Data = data
		m.Header.Set(contract.HeaderCommitTime, committed)
		f, err := e.js.PublishMsgAsync(m, jetstream.WithMsgID(evs[i].ID.String()))
		if err != nil {
			b.Fatal(err)
		}
		if futures = append(futures, f); len(futures) == window {
			wait()
		}
	}
	wait()
}

// notify runs a notifier on hookURL over the prefilled events until the
// runtime has caught up (every message acknowledged), and returns how long
// that took. It fails unless each event's effect was sent exactly once.
func (e *benchNATS) notify(b *testing.B, hookURL string, recv *benchReceiver, evs []contract.Event) time.Duration {
	b.Helper()
	recv.reset()
	m := NewMetrics(nil)
	n, err := New(context.Background(), e.js, Config{URLs: []string{hookURL}, Secret: testSecret}, m, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	// The notifier service's runtime (projector.ServiceFlags' defaults made
	// the notifier's), until caught up.
	rc := RuntimeConfig(projector.Config{Name: benchConsumer, BatchSize: 256, Parallel: 2, AckWait: 60 * time.Second, MaxDeliver: 5})
	rc.StopWhenCaughtUp = true
	r, err := projector.New(e.js, n, rc, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	pprof.Do(ctx, pprof.Labels("side", "notifier"), func(ctx context.Context) { err = r.Run(ctx) })
	took := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	if ctx.Err() != nil {
		b.Fatalf("the notifier did not catch up within 10m")
	}
	_ = n.Close()

	info, left, err := e.consumerInfo()
	if err != nil {
		b.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Stream < e.lastSeq || left != 0 {
		b.Fatalf("consumer %s: %d pending, %d awaiting an ack, ack floor %d, %d messages left in the work queue; want everything up to %d acknowledged",
			benchConsumer, info.NumPending, info.NumAckPending, info.AckFloor.Stream, left, e.lastSeq)
	}
	recv.expectOnce(b, hookURL, evs)
	name := targetNames([]string{hookURL})[0]
	if sent := testutil.ToFloat64(m.Sent.WithLabelValues(name)); int(sent) != len(evs) {
		b.Fatalf("the notifier counts %v effects sent, want %d", sent, len(evs))
	}
	if retried, dup := testutil.ToFloat64(m.Retried.WithLabelValues(name)), testutil.ToFloat64(m.Deduplicated.WithLabelValues(name)); retried+dup > 0 {
		b.Logf("notifier: %v attempts retried, %v effects found sent already (each effect still arrived once)", retried, dup)
	}
	return took
}

// consumerInfo is the notifier's consumer and the number of messages
// still in the effects' stream (a work queue: acknowledged ones leave it).
func (e *benchNATS) consumerInfo() (*jetstream.ConsumerInfo, uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.js.Consumer(ctx, contract.EventsStream, benchConsumer)
	if err != nil {
		return nil, 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	s, err := e.js.Stream(ctx, contract.EventsStream)
	if err != nil {
		return nil, 0, err
	}
	return info, s.CachedInfo().State.Msgs, nil
}

// plainPosts sends each event's notification to hookURL once, through the
// notifier's own request (encoding, signature, headers, default client,
// timeout) from as many workers as the notifier's Concurrency, without the
// dedup store or the stream, and returns how long that took.
func plainPosts(b *testing.B, hookURL string, recv *benchReceiver, evs []contract.Event) time.Duration {
	b.Helper()
	recv.reset()
	cfg := Config{URLs: []string{hookURL}, Secret: testSecret}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	// A Notifier without New: no dedup store, only what post uses.
	n := &Notifier{cfg: cfg, client: newClient(cfg.Concurrency), metrics: NewMetrics(nil), log: discardLogger()}
	t := &target{url: hookURL, name: targetNames([]string{hookURL})[0], hidden: hiddenParts(hookURL), effect: effectName(hookURL)}
	took, err := inParallel(context.Background(), "plain", cfg.Concurrency, len(evs), func(ctx context.Context, i int) error {
		ev := &evs[i]
		effect := contract.EffectID(t.effect, ev.ID)
		body, err := encodeNotification(effect, ev)
		if err != nil {
			return err
		}
		return n.post(ctx, t, effect, ev, body, 1)
	})
	if err != nil {
		b.Fatal(err)
	}
	recv.expectOnce(b, hookURL, evs)
	return took
}

// benchReceiver is a webhook receiver that answers 200 at once, after
// checking the signature on its own (not with this package's code), and
// counts the requests of each effect.
type benchReceiver struct {
	srv *httptest.Server

	mu   sync.Mutex
	seen map[string]int // by path and Idempotency-Key
	bad  []string       // requests that were not signed right
}

func newBenchReceiver(b *testing.B) *benchReceiver {
	b.Helper()
	r := &benchReceiver{seen: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	b.Cleanup(r.srv.Close)
	return r
}

func (r *benchReceiver) url(path string) string { return r.srv.URL + path }

func (r *benchReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	signed := signedRight(testSecret, req.Header, body)
	key := req.Header.Get(HeaderIdempotencyKey)
	r.mu.Lock()
	r.seen[req.URL.Path+" "+key]++
	if !signed {
		r.bad = append(r.bad, req.URL.Path+" "+key)
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK) // a bad signature fails the round, not the effect
}

func (r *benchReceiver) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen, r.bad = map[string]int{}, nil
}

// expectOnce fails unless the receiver got, on url, exactly one request
// (each answered 200) per effect of evs, signed right, and nothing else.
func (r *benchReceiver) expectOnce(b *testing.B, u string, evs []contract.Event) {
	b.Helper()
	path := strings.TrimPrefix(u, r.srv.URL)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) > 0 {
		b.Fatalf("%d requests not signed right, the first %s", len(r.bad), r.bad[0])
	}
	missing, twice := 0, 0
	for i := range evs {
		switch r.seen[path+" "+EffectID(u, evs[i].ID).String()] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if missing > 0 || twice > 0 || len(r.seen) != len(evs) {
		b.Fatalf("%s: of %d effects, %d not delivered, %d delivered more than once (2xx each time); %d distinct keys seen",
			path, len(evs), missing, twice, len(r.seen))
	}
}

// benchDocument is document i of a run: a ~2 KB body of a few paragraphs,
// three links and two tags, as cmd/converge's benchmark writes.
func benchDocument(run string, i int) contract.Document {
	words := strings.Fields("replication slot outbox commit stream consumer projector index graph vector chunk " +
		"version marker tombstone snapshot digest bucket relay writer batch acknowledge deliver converge " +
		"postgres jetstream embedding search neighbour link tag meta document key")
	rng := rand.New(rand.NewPCG(uint64(i), 7)) //nolint:gosec // reproducible text, not a secret
	var body strings.Builder
	for body.Len() < 1900 {
		for range 12 + rng.IntN(10) {
			body.WriteString(words[rng.IntN(len(words))])
			body.WriteByte(' ')
		}
		body.WriteString(run + ". ")
		if rng.IntN(4) == 0 {
			body.WriteString("\n\n")
		}
	}
	key := func(j int) string { return fmt.Sprintf("bench/%s/%06d", run, j) }
	return contract.Document{Key: key(i), Version: 1, Title: fmt.Sprintf("Bench %s document %d", run, i), Body: body.String(),
		Links: []string{key(i + 1), key(i*7 + 3), key(rng.IntN(1000))},
		Tags:  []string{"bench", "t" + strconv.Itoa(i%16)},
		Meta:  json.RawMessage(`{"source":"converge bench","run":"` + run + `"}`)}
}

// benchEvents are the events the writer would emit for n documents of a
// run: normalised, chunked by the writer's chunker.
func benchEvents(run string, n int) []contract.Event {
	evs := make([]contract.Event, n)
	for i := range evs {
		d, err := benchDocument(run, i).Normalize()
		if err != nil {
			panic(err)
		}
		evs[i] = contract.NewUpsertedEvent(d, chunking.Split(d.Body, chunking.DefaultConfig()))
	}
	return evs
}

// benchWriter is the writer's HTTP API over a migrated database of a
// PostgreSQL cluster started for the benchmark.
type benchWriter struct {
	srv    *httptest.Server
	client *http.Client
}

func startBenchWriter(b *testing.B) *benchWriter {
	b.Helper()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(nil)
	if err != nil {
		b.Fatalf("%v (scripts/ensure-postgres.sh installs the server binaries)", err)
	}
	b.Cleanup(pg.Close)
	cfg, err := pgxpool.ParseConfig(pg.MigratedDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = writer.DefaultMaxConns // the writer service's pool
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < writerSeedDocs; i += 100 {
		ws := make([]docstore.Write, 0, 100)
		for j := i; j < min(i+100, writerSeedDocs); j++ {
			ws = append(ws, docstore.Write{Doc: benchDocument("seed", j)})
		}
		if _, err := store.Apply(ctx, ws); err != nil {
			b.Fatal(err)
		}
	}
	// Statistics, which autovacuum gathers only a minute after the
	// database appears: without them the writer's statement scans every
	// chunk (see docstore's BenchmarkApply).
	if _, err := pool.Exec(ctx, `ANALYZE documents, chunks, outbox`); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(writer.NewAPI(store, writer.APIConfig{}, nil, nil))
	b.Cleanup(srv.Close)
	w := &benchWriter{srv: srv, client: &http.Client{Timeout: time.Minute,
		Transport: &http.Transport{MaxIdleConns: 2 * writerBenchClients, MaxIdleConnsPerHost: 2 * writerBenchClients}}}
	w.putSingles(ctx, b, "warm", 4*writerBenchClients) // connections open, statements prepared
	return w
}

// putSingles writes n documents with one PUT each from writerBenchClients
// clients as fast as they go, and returns the time until the last answer.
func (w *benchWriter) putSingles(ctx context.Context, b *testing.B, run string, n int) time.Duration {
	b.Helper()
	bodies := make([][]byte, n)
	keys := make([]string, n)
	for i := range bodies {
		d := benchDocument(run, i)
		body, err := json.Marshal(d)
		if err != nil {
			b.Fatal(err)
		}
		bodies[i], keys[i] = body, w.srv.URL+"/v1/documents/"+url.PathEscape(d.Key)
	}
	took, err := inParallel(ctx, "writer", writerBenchClients, n, func(ctx context.Context, i int) error {
		return w.put(ctx, keys[i], bodies[i])
	})
	if err != nil {
		b.Fatal(err)
	}
	return took
}

func (w *benchWriter) put(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var r writer.WriteResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Result != string(docstore.Applied) {
		return fmt.Errorf("writer: PUT %s: %s, result %q, %w", u, resp.Status, r.Result, err)
	}
	return nil
}

// inParallel calls do for 0..n-1 from workers goroutines carrying the
// pprof label side (so that a profile splits by side), stopping at the
// first error, and returns how long it took.
func inParallel(ctx context.Context, side string, workers, n int, do func(ctx context.Context, i int) error) (time.Duration, error) {
	var next atomic.Int64
	var errOnce sync.Once
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	pprof.Do(ctx, pprof.Labels("side", side), func(ctx context.Context) {
		for range workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						return
					}
					if err := do(ctx, i); err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
				}
			})
		}
		wg.Wait()
	})
	return time.Since(start), firstErr
}
