package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	gembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/index"
	iembedded "github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/projector"
	rebuildpkg "github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// The end-to-end benchmarks of `make bench`: the whole pipeline in this
// process (startDev: a throwaway PostgreSQL 15, embedded NATS, the writer,
// the relay, the embedded index and graph projectors), and a rebuild of
// each projection from a stream filled directly.
const (
	envBenchDocs    = "CONVERGE_BENCH_DOCS"          // documents of the throughput run
	envRebuildDocs  = "CONVERGE_BENCH_REBUILD_DOCS"  // documents of the rebuild
	envLatencyRate  = "CONVERGE_BENCH_LATENCY_RATE"  // documents/s of the latency runs; default half the end-to-end rate
	envLatencyBatch = "CONVERGE_BENCH_LATENCY_BATCH" // documents per request of the latency run

	defaultBenchDocs      = 20000
	defaultRebuildDocs    = 100000
	calibrationDocs       = 10000 // the latency run's calibration, when the throughput run did not run first
	singleCalibrationDocs = 5000  // the single-document latency run's calibration

	batchLines    = 100 // documents per POST /v1/documents:batch
	writerClients = 4   // concurrent batch clients

	latencyRun          = 20 * time.Second
	latencyWorkers      = 32         // concurrent clients, so that the pacing is open loop
	defaultLatencyBatch = batchLines // documents per POST /v1/documents:batch of the latency run: as in the throughput run
	// latencyRatioTarget bounds p99 of commit -> applied over p99 of
	// commit -> stored in JetStream, at half the max rate.
	latencyRatioTarget = 1.5
	// e2eTarget is the end-to-end rate over the writer's, at least.
	e2eTarget = 0.9

	rebuildTargetDocs = 100000
	rebuildTarget     = 60 * time.Second

	commitToApplied = "converge_projector_commit_to_applied_seconds"
)

func envCount(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number of documents", name, v)
	}
	return n
}

// BenchmarkEndToEnd measures the pipeline from the writer's API to both
// projections: the throughput of batched writes (the max rate), the
// commit -> applied latency of the same batched writes paced at half that
// rate (and at a quarter of it), and the latency of single-document writes at half of their own,
// much lower, end-to-end capacity.
func BenchmarkEndToEnd(b *testing.B) { benchEndToEnd(b, false) }

// BenchmarkEndToEndProcesses is BenchmarkEndToEnd in the deployed layout:
// the writer, the relay and each projector a process of its own (the real
// binaries, built here), so that no service's memory and garbage
// collection slow another's.
func BenchmarkEndToEndProcesses(b *testing.B) { benchEndToEnd(b, true) }

func benchEndToEnd(b *testing.B, processes bool) {
	n := envCount(b, envBenchDocs, defaultBenchDocs)
	ctx := context.Background()
	s, ready := startBenchStack(b, processes)
	defer s.close(b)
	// A benchmark with sub-benchmarks prints no log of its own: the first
	// sub-benchmark to run says how the pipeline started.
	var once sync.Once
	note := func(b *testing.B) { once.Do(func() { b.Log(ready) }) }

	runs := 0
	var maxRate float64 // the batch API's end-to-end documents/s, once measured
	b.Run("throughput", func(b *testing.B) {
		note(b)
		var write, conv, ver time.Duration
		var pressure string
		var chunks float64
		for range b.N {
			runs++
			r := s.throughput(ctx, b, fmt.Sprintf("tp%d", runs), n)
			write += r.write
			conv += r.converge
			ver += r.verify
			pressure, chunks = r.pressure, r.chunks
		}
		docs := float64(n) * float64(b.N)
		writeRate, rate := docs/write.Seconds(), docs/conv.Seconds()
		maxRate = rate
		b.ReportMetric(writeRate, "writer_docs/s")
		b.ReportMetric(rate, "e2e_docs/s")
		benchsummary.Log(b, benchsummary.Row{Target: "end-to-end rate / the writer's, " + s.layout,
			Figure: fmt.Sprintf("%.0f docs/s", rate), Limit: fmt.Sprintf("%.0f docs/s", writeRate), Ratio: rate / writeRate,
			Goal: fmt.Sprintf(">= %.1f", e2eTarget), Met: rate/writeRate >= e2eTarget})
		b.ReportMetric(ver.Seconds()/float64(b.N), "verify_s")
		b.Logf("throughput, %d documents of ~2 KB (%.2f chunks, 3 links, 2 tags each) in batches of %d from %d clients: writer %.0f docs/s (last write acknowledged after %v); "+
			"end to end %.0f docs/s (both projectors caught up after %v), %.2f of the writer's rate; verify agreed in %v (not in the throughput); %s",
			n, chunks, batchLines, writerClients, writeRate, (write / time.Duration(b.N)).Round(time.Millisecond),
			rate, (conv / time.Duration(b.N)).Round(time.Millisecond), rate/writeRate, (ver / time.Duration(b.N)).Round(time.Millisecond), pressure)
	})
	// The latency runs write at half a capacity measured here: the
	// batch API's end-to-end rate above (or a calibration run of it), and
	// for single-document writes their own, much lower, capacity.
	b.Run("latency", func(b *testing.B) {
		note(b)
		per := envCount(b, envLatencyBatch, defaultLatencyBatch)
		rate, load := latencyRate(b)
		if rate == 0 {
			if maxRate == 0 {
				runs++
				c := min(n, calibrationDocs)
				r := s.throughput(ctx, b, fmt.Sprintf("cal%d", runs), c)
				maxRate = float64(c) / r.converge.Seconds()
				b.Logf("calibration: %d documents in batches of %d, unpaced: %.0f docs/s end to end (both projections applied)", c, batchLines, maxRate)
			}
			b.ReportMetric(maxRate, "max_e2e_docs/s")
			rate = maxRate / 2
			load = fmt.Sprintf("half the batch API's end-to-end rate %.0f docs/s, measured in this run", maxRate)
		} else {
			s.warmUp(ctx, b, &runs)
		}
		for range b.N {
			runs++
			s.latency(ctx, b, fmt.Sprintf("lat%d", runs), rate, per, load, true)
		}
	})
	// The same batched writes at a quarter of the max rate: how the
	// latency falls with the load, below the target's half.
	b.Run("latency-quarter", func(b *testing.B) {
		note(b)
		if _, set := latencyRate(b); set != "" || maxRate == 0 {
			b.Skip("no max rate measured in this run (the throughput or latency run did not run, or " + envLatencyRate + " is set)")
		}
		per := envCount(b, envLatencyBatch, defaultLatencyBatch)
		for range b.N {
			runs++
			s.latency(ctx, b, fmt.Sprintf("q%d", runs), maxRate/4, per,
				fmt.Sprintf("a quarter of the batch API's end-to-end rate %.0f docs/s, measured in this run; the target is for half", maxRate), false)
		}
	})
	b.Run("latency-single", func(b *testing.B) {
		note(b)
		rate, load := latencyRate(b)
		if rate == 0 {
			runs++
			c := min(n, singleCalibrationDocs)
			capacity := s.singleCapacity(ctx, b, fmt.Sprintf("cap%d", runs), c)
			b.ReportMetric(capacity, "single_put_e2e_docs/s")
			b.Logf("capacity: %d single-document PUTs from %d clients, unpaced: %.0f docs/s end to end (both projections applied)", c, latencyWorkers, capacity)
			rate = capacity / 2
			load = fmt.Sprintf("half the single-PUT end-to-end rate %.0f docs/s, measured in this run", capacity)
		} else {
			s.warmUp(ctx, b, &runs)
		}
		for range b.N {
			runs++
			s.latency(ctx, b, fmt.Sprintf("one%d", runs), rate, 1, load, false)
		}
	})
}

// latencyRate is the rate CONVERGE_BENCH_LATENCY_RATE sets, or 0.
func latencyRate(b *testing.B) (float64, string) {
	v := os.Getenv(envLatencyRate)
	if v == "" {
		return 0, ""
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r <= 0 {
		b.Fatalf("%s=%q: want documents per second", envLatencyRate, v)
	}
	return r, "set by " + envLatencyRate + ", not half load"
}

// warmUp writes as a calibration would before a latency run at a set
// rate, or the first second's cold start decides the p99.
func (s *benchStack) warmUp(ctx context.Context, b *testing.B, runs *int) {
	*runs++
	warm := s.singleCapacity(ctx, b, fmt.Sprintf("warm%d", *runs), 1000)
	b.Logf("warm-up: 1000 single-document PUTs, unpaced: %.0f docs/s end to end", warm)
}

// benchStack is the dev pipeline plus the clients the benchmarks use.
type benchStack struct {
	layout string // "one process" or "a process each"
	dev    *stack.Stack
	pool   *pgxpool.Pool
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	client *http.Client
	// services are the writer, relay and projector processes of the
	// deployed layout; none when the pipeline runs in this process.
	services []*proc.Child
}

func startBenchStack(b *testing.B, processes bool) (*benchStack, string) {
	b.Helper()
	ctx := context.Background()
	cfg := stack.Config{Log: config.NewLogger(os.Stderr, "warn"), LogOut: os.Stderr,
		Index: &indexprojector.Config{}, Graph: &graphprojector.Config{}, InfraOnly: processes}
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr} {
		addr, err := stack.FreeAddr()
		if err != nil {
			b.Fatal(err)
		}
		*a = addr
	}
	var bin *testenv.Binaries
	if processes {
		bin = testenv.BuildBinaries(b)
	}
	began := time.Now()
	dev, err := stack.Start(ctx, cfg)
	if err != nil {
		b.Fatalf("start the pipeline: %v", err)
	}
	s := &benchStack{layout: "one process", dev: dev, client: &http.Client{Timeout: time.Minute,
		Transport: &http.Transport{MaxIdleConns: 2 * latencyWorkers, MaxIdleConnsPerHost: 2 * latencyWorkers}}}
	if processes {
		s.layout = "a process each"
		if err := s.startServices(ctx, bin); err != nil {
			s.close(b)
			b.Fatalf("start the services: %v", err)
		}
	}
	if s.pool, err = pgxpool.New(ctx, dev.ReaderURL); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	natsOpts, err := dev.OperatorNATS.Options()
	if err != nil {
		s.close(b)
		b.Fatal(err)
	}
	if s.nc, err = nats.Connect(dev.NATSURL, natsOpts...); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	// The relay creates the stream when it starts.
	if s.stream, err = s.js.Stream(ctx, contract.DocsStream); err != nil {
		s.close(b)
		b.Fatalf("stream CONVERGE_DOCS: %v", err)
	}
	return s, fmt.Sprintf("pipeline ready in %v: PostgreSQL 15 (throwaway, fsync off), embedded NATS (in the benchmark's process), writer, relay, embedded index and graph projectors, %s; on %d CPUs",
		time.Since(began).Round(time.Millisecond), s.layout, runtime.NumCPU())
}

// benchServices are the processes of the deployed layout, in the order
// startServices starts them.
var benchServices = []string{"writer", "relay", "projector-index", "projector-graph"}

func (s *benchStack) startServices(ctx context.Context, bin *testenv.Binaries) error {
	cfg := s.dev.Config
	natsURL, data, tokens := s.dev.NATSURL, cfg.DataDir, s.dev.TokensFile
	// Each service runs as its own Postgres role and NATS user, as
	// deployed; passwords travel in the environment, never in argv.
	for _, svc := range []struct {
		name, user string
		args       []string
	}{
		{"writer", natsauth.UserWriter, []string{"-postgres-url", s.dev.WriterURL, "-http-addr", cfg.HTTPAddr, "-metrics-addr", cfg.WriterAddr, "-tokens-file", tokens}},
		{"relay", natsauth.UserRelay, []string{"-postgres-url", s.dev.RelayURL, "-nats-url", natsURL, "-metrics-addr", cfg.RelayAddr}},
		{"projector-index", natsauth.UserIndex, []string{"-nats-url", natsURL, "-data-dir", data, "-metrics-addr", cfg.IndexAddr, "-tokens-file", tokens}},
		{"projector-graph", natsauth.UserGraph, []string{"-nats-url", natsURL, "-data-dir", data, "-metrics-addr", cfg.GraphAddr, "-tokens-file", tokens}},
	} {
		args := append(svc.args, "-log-level", "warn")
		opts := proc.Options{Out: os.Stderr, Unset: []string{config.EnvPostgresURL, natsauth.EnvUser, natsauth.EnvPassword}}
		if na := s.dev.NATSAuth(svc.user); na.User != "" && svc.name != "writer" {
			args = append(args, "-nats-user", na.User)
			opts.Env = append(opts.Env, natsauth.EnvPassword+"="+na.Password)
		}
		c, err := proc.Start(bin.Path(svc.name), args, opts)
		if err != nil {
			return fmt.Errorf("start %s: %w", svc.name, err)
		}
		s.services = append(s.services, c)
	}
	relayActive := func() bool {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		m, err := telemetry.Scrape(sctx, "http://"+cfg.RelayAddr+"/metrics")
		if err != nil {
			return false
		}
		active, err := m.Value("converge_relay_active", nil)
		return err == nil && active == 1
	}
	for _, w := range []struct {
		what  string
		ready func() bool
	}{
		{"the writer", func() bool { return stack.HTTPOK("http://" + cfg.WriterAddr + "/readyz") }},
		{"the relay to hold its slot", relayActive},
		{"the index projector", func() bool { return stack.HTTPOK("http://" + cfg.IndexAddr + "/readyz") }},
		{"the graph projector", func() bool { return stack.HTTPOK("http://" + cfg.GraphAddr + "/readyz") }},
	} {
		// A service that exits while starting ends the wait at once.
		err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { _, c := s.exited(); return c != nil || w.ready() })
		if name, c := s.exited(); c != nil {
			return fmt.Errorf("%s exited while starting: %w", name, c.Err())
		}
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", w.what, err)
		}
	}
	s.dev.APIURL = "http://" + cfg.HTTPAddr
	return nil
}

// exited returns a service process that has exited and its name, or nil.
func (s *benchStack) exited() (string, *proc.Child) {
	for i, c := range s.services {
		if c.Exited() {
			return benchServices[i], c
		}
	}
	return "", nil
}

func (s *benchStack) close(b *testing.B) {
	for _, c := range s.services {
		_ = c.Stop(30 * time.Second)
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if err := s.dev.Stop(); err != nil {
		b.Errorf("stop the pipeline: %v", err)
	}
}

// benchDocument is document i of n of a run: a ~2 KB body of a few
// paragraphs, three links to other documents of the run (some not written
// yet: stubs in the graph) and two tags.
func benchDocument(run string, i, n int) contract.Document {
	words := strings.Fields("replication slot outbox commit stream consumer projector index graph vector chunk " +
		"version marker tombstone snapshot digest bucket relay writer batch acknowledge deliver converge " +
		"postgres jetstream embedding search neighbour link tag meta document key")
	rng := rand.New(rand.NewPCG(uint64(i), 1)) //nolint:gosec // reproducible text, not a secret
	var body strings.Builder
	for body.Len() < 1900 {
		for range 12 + rng.IntN(10) {
			body.WriteString(words[rng.IntN(len(words))])
			body.WriteByte(' ')
		}
		body.WriteString(run)
		body.WriteString(". ")
		if rng.IntN(4) == 0 {
			body.WriteString("\n\n")
		}
	}
	return contract.Document{
		Key: benchKey(run, i), Version: 1, Title: fmt.Sprintf("Bench %s document %d", run, i), Body: body.String(),
		Links: []string{benchKey(run, (i+1)%n), benchKey(run, (i*7+3)%n), benchKey(run, rng.IntN(n))},
		Tags:  []string{"bench", "t" + strconv.Itoa(i%16)},
		Meta:  json.RawMessage(`{"source":"converge bench","run":"` + run + `"}`),
	}
}

func benchKey(run string, i int) string { return fmt.Sprintf("bench/%s/%06d", run, i) }

type throughputResult struct {
	write, converge, verify time.Duration
	pressure                string  // the machine's CPU pressure while writing and converging
	chunks                  float64 // a document's, on average
}

// throughput writes n new documents through the batch API and times the
// last acknowledged write, both projectors catching up, and a verify.
func (s *benchStack) throughput(ctx context.Context, b *testing.B, run string, n int) throughputResult {
	b.Helper()
	var batches [][]byte
	chunks := 0
	for lo := 0; lo < n; lo += batchLines {
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		for i := lo; i < min(lo+batchLines, n); i++ {
			d := benchDocument(run, i, n)
			if err := enc.Encode(d); err != nil {
				b.Fatal(err)
			}
			chunks += len(chunking.Split(d.Body, chunking.DefaultConfig())) // the writer's chunker
		}
		batches = append(batches, body.Bytes())
	}
	from := s.lastSeq(ctx, b)

	stallFrom, _ := cpuStalled()
	start := time.Now()
	var next, applied atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range writerClients {
		g.Go(func() error {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(batches) {
					return nil
				}
				a, err := s.postBatch(gctx, batches[i])
				if err != nil {
					return err
				}
				applied.Add(int64(a))
			}
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	r := throughputResult{chunks: float64(chunks) / float64(n)}
	r.write = time.Since(start)
	if applied.Load() != int64(n) {
		b.Fatalf("the writer applied %d of %d new documents", applied.Load(), n)
	}
	s.waitCaughtUp(ctx, b, from+uint64(n))
	r.converge = time.Since(start)
	r.pressure = cpuPressure(stallFrom, r.converge)

	verifyStart := time.Now()
	s.mustAgree(ctx, b)
	r.verify = time.Since(verifyStart)
	return r
}

// postBatch posts one NDJSON batch and returns how many lines were applied.
func (s *benchStack) postBatch(ctx context.Context, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.dev.APIURL+"/v1/documents:batch", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	auth.SetBearer(req.Header, s.dev.WriterToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("writer: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("writer: %s", resp.Status)
	}
	applied := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line struct {
			Result string          `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return applied, fmt.Errorf("writer: unreadable result line %q", sc.Text())
		}
		if line.Result != "applied" {
			return applied, fmt.Errorf("writer: result %q %s", line.Result, line.Error)
		}
		applied++
	}
	return applied, sc.Err()
}

func (s *benchStack) lastSeq(ctx context.Context, b *testing.B) uint64 {
	b.Helper()
	info, err := s.stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return info.State.LastSeq
}

// waitCaughtUp polls until the stream holds every event up to seq and both
// projectors' consumers have been delivered it, with nothing pending and
// nothing unacknowledged: the projector acknowledges only after its store
// write.
func (s *benchStack) waitCaughtUp(ctx context.Context, b *testing.B, seq uint64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for _, name := range []string{"index", "graph"} {
		for {
			c, err := s.js.Consumer(ctx, contract.DocsStream, name)
			if err == nil {
				info, err := c.Info(ctx)
				if err == nil && info.Delivered.Stream >= seq && info.NumPending == 0 && info.NumAckPending == 0 {
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("the %s projector did not reach stream sequence %d within 5 minutes", name, seq)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// mustAgree compares both projections with Postgres (verify.Compare of
// the bucket digests, the projectors answering over HTTP).
func (s *benchStack) mustAgree(ctx context.Context, b *testing.B) {
	b.Helper()
	truth := &postgres.Postgres{Pool: s.pool}
	for _, side := range bothSides(s.dev.IndexAddr, s.dev.GraphAddr, s.dev.OperatorToken) {
		rep, err := verify.Compare(ctx, truth, side.Side, side.Kind, verify.DefaultBuckets, nil)
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Agrees {
			b.Fatalf("verify: %s disagrees with Postgres on %d documents once caught up (first: %+v)", rep.Store, len(rep.Differences), rep.Differences[0])
		}
	}
}

// singleCapacity writes n documents with one PUT each from latencyWorkers
// clients as fast as they go, and returns documents/s until both
// projections have applied them.
func (s *benchStack) singleCapacity(ctx context.Context, b *testing.B, run string, n int) float64 {
	b.Helper()
	from := s.lastSeq(ctx, b)
	jobs := make(chan int, n)
	for i := range n {
		jobs <- i
	}
	close(jobs)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range latencyWorkers {
		g.Go(func() error {
			for i := range jobs {
				d := benchDocument(run, i, n)
				body, err := json.Marshal(d)
				if err != nil {
					return err
				}
				if err := s.put(gctx, s.dev.APIURL+"/v1/documents/"+url.PathEscape(d.Key), body); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	s.waitCaughtUp(ctx, b, from+uint64(n))
	return float64(n) / time.Since(start).Seconds()
}

// latency writes documents at rate for latencyRun, per documents a request
// (1: PUT /v1/documents/{key}, more: POST /v1/documents:batch), open loop:
// each request is due at start + i*per/rate, whatever the earlier ones
// took. It reports each projector's commit -> applied latency from its
// histogram.
// With target, the run is the one the latency target is for (half the
// max rate): its ratios go to the summary.
func (s *benchStack) latency(ctx context.Context, b *testing.B, run string, rate float64, per int, load string, target bool) {
	b.Helper()
	requests := int(rate * latencyRun.Seconds() / float64(per))
	n := requests * per
	if n < 1 {
		b.Fatalf("rate %.2f docs/s in requests of %d gives no request in %v", rate, per, latencyRun)
	}
	send := make([]func(context.Context) error, requests)
	for j := range requests {
		if per == 1 {
			d := benchDocument(run, j, n)
			body, err := json.Marshal(d)
			if err != nil {
				b.Fatal(err)
			}
			u := s.dev.APIURL + "/v1/documents/" + url.PathEscape(d.Key)
			send[j] = func(ctx context.Context) error { return s.put(ctx, u, body) }
			continue
		}
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		for i := j * per; i < (j+1)*per; i++ {
			if err := enc.Encode(benchDocument(run, i, n)); err != nil {
				b.Fatal(err)
			}
		}
		send[j] = func(ctx context.Context) error {
			applied, err := s.postBatch(ctx, body.Bytes())
			if err == nil && applied != per {
				err = fmt.Errorf("writer: %d of %d documents applied", applied, per)
			}
			return err
		}
	}
	addrs := map[string]string{"index": s.dev.IndexAddr, "graph": s.dev.GraphAddr}
	before := map[string]projectorMetrics{}
	for name, addr := range addrs {
		before[name] = scrapeProjector(b, addr)
	}
	relayBefore := s.scrapeRelay(b)
	from := s.lastSeq(ctx, b)

	jobs := make(chan int, requests)
	roundTrips := make([]time.Duration, requests)
	g, gctx := errgroup.WithContext(ctx)
	for range latencyWorkers {
		g.Go(func() error {
			for i := range jobs {
				t := time.Now()
				if err := send[i](gctx); err != nil {
					return err
				}
				roundTrips[i] = time.Since(t)
			}
			return nil
		})
	}
	stallFrom, _ := cpuStalled()
	start := time.Now()
	var maxLate time.Duration
	for i := range requests {
		due := start.Add(time.Duration(float64(i*per) / rate * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else {
			maxLate = max(maxLate, -d)
		}
		if gctx.Err() != nil {
			break // a request failed: g.Wait reports it
		}
		jobs <- i
	}
	close(jobs)
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	sent := time.Since(start)
	s.waitCaughtUp(ctx, b, from+uint64(n))
	pressure := cpuPressure(stallFrom, time.Since(start))
	// A projector observes the latency right after acknowledging, so its
	// histogram may trail the consumer's state by a moment.
	after := map[string]projectorMetrics{}
	for name, addr := range addrs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			after[name] = scrapeProjector(b, addr)
			if after[name].latency.count-before[name].latency.count >= float64(n) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	relayStage, err := s.scrapeRelay(b).minus(relayBefore)
	if err != nil {
		b.Fatalf("relay: %v", err)
	}
	slices.Sort(roundTrips)
	achieved := float64(n) / sent.Seconds()
	how := "single-document PUTs"
	if per > 1 {
		how = fmt.Sprintf("documents in batch POSTs of %d", per)
	}
	b.Logf("latency: %d %s paced at %.0f docs/s (%s) for %v: achieved %.0f docs/s, "+
		"pacer at most %v late; request round trip p50 %v p99 %v (client side, exact); %s",
		n, how, rate, load, sent.Round(time.Millisecond), achieved, maxLate.Round(time.Microsecond),
		roundTrips[requests/2].Round(time.Microsecond), roundTrips[min(requests-1, requests*99/100)].Round(time.Microsecond), pressure)
	b.Logf("relay, commit -> JetStream acknowledgement: p50 %.1f ms, p99 %.1f ms, mean %.1f ms (exact) over %d events",
		1000*relayStage.quantile(0.5), 1000*relayStage.quantile(0.99), 1000*relayStage.sum/relayStage.count, int(relayStage.count))
	stored := s.storedLatencies(ctx, b, from+1, n)
	storedP50, storedP99 := exactQuantile(stored, 0.50), exactQuantile(stored, 0.99)
	b.Logf("commit -> stored in JetStream (each message's store time, exact) over %d events: p50 %.1f ms, p99 %.1f ms (this machine's)",
		len(stored), 1000*storedP50, 1000*storedP99)
	b.ReportMetric(storedP50*1000, "stored_p50_ms")
	b.ReportMetric(storedP99*1000, "stored_p99_ms")
	b.ReportMetric(achieved, "paced_docs/s")
	for _, name := range []string{"index", "graph"} {
		h, err := after[name].latency.minus(before[name].latency)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		batches, err := after[name].batches.minus(before[name].batches)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		events := after[name].events - before[name].events
		if h.count != float64(n) {
			b.Errorf("%s: %v commit -> applied observations, want one per document (%d)", name, h.count, n)
		}
		// Precision: the histogram's buckets (the projector's latency buckets:
		// ..., 40, 45, 50, 60 ms, ...) are all a projector records, so a
		// quantile is interpolated linearly within its bucket, as
		// Prometheus's histogram_quantile does; the true value can be
		// anywhere in that bucket. The mean (sum/count) is exact.
		p50, p99 := h.quantile(0.50), h.quantile(0.99)
		lo, hi, inBucket := h.bucketOf(0.99)
		// The target is a ratio to what reaching the stream already costs
		// in the same run: the projectors may add at most half again to
		// its tail. The bucket bounds around the p99 bound the ratio.
		ratio := p99 / storedP99
		b.ReportMetric(p50*1000, name+"_p50_ms")
		b.ReportMetric(p99*1000, name+"_p99_ms")
		b.ReportMetric(ratio, name+"_p99_ratio")
		b.Logf("%s projector, commit -> applied over %d events: p50 %.1f ms, p99 %.1f ms, mean %.1f ms (this machine's); "+
			"p99 interpolated within the bucket (%s, %s] of %.0f events, so the ratio lies in [%.2f, %.2f]; "+
			"p99 applied / p99 stored %.2f (target <= %.1f): %s; p50 applied / p50 stored %.2f; "+
			"%.0f batches of %.1f events on average, %.1f ms each to apply and acknowledge (p50 %.1f ms, p99 %.1f ms, in buckets doubling from 0.5 ms)",
			name, int(h.count), p50*1000, p99*1000, 1000*h.sum/h.count, fmtSeconds(lo), fmtSeconds(hi), inBucket,
			lo/storedP99, hi/storedP99, ratio, latencyRatioTarget, metOrMissed(ratio <= latencyRatioTarget), p50/storedP50,
			batches.count, events/batches.count, 1000*batches.sum/batches.count, 1000*batches.quantile(0.5), 1000*batches.quantile(0.99))
		if target {
			benchsummary.Log(b, benchsummary.Row{Target: fmt.Sprintf("p99 commit->applied / p99 commit->stored, %s, %s, half the max rate", name, s.layout),
				Figure: fmt.Sprintf("%.1f ms", 1000*p99), Limit: fmt.Sprintf("%.1f ms", 1000*storedP99), Ratio: ratio,
				Goal: fmt.Sprintf("<= %.1f", latencyRatioTarget), Met: ratio <= latencyRatioTarget})
		}
	}
}

// storedLatencies reads the n messages of the stream from seq on (one
// direct get each, a few at once) and returns, sorted, the time from each
// event's Postgres commit (its commit-time header) to its storing in
// JetStream (the message's timestamp, which the server sets when it
// stores it).
func (s *benchStack) storedLatencies(ctx context.Context, b *testing.B, seq uint64, n int) []time.Duration {
	b.Helper()
	out := make([]time.Duration, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			m, err := s.stream.GetMsg(gctx, seq+uint64(i))
			if err != nil {
				return fmt.Errorf("message %d: %w", seq+uint64(i), err)
			}
			committed, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime))
			if err != nil {
				return fmt.Errorf("message %d: commit time: %w", seq+uint64(i), err)
			}
			out[i] = m.Time.Sub(committed)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// exactQuantile is the q-quantile of sorted, in seconds.
func exactQuantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))].Seconds()
}

func metOrMissed(met bool) string {
	if met {
		return "MET"
	}
	return "MISSED"
}

func (s *benchStack) put(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	auth.SetBearer(req.Header, s.dev.WriterToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	defer resp.Body.Close()
	var r struct {
		Result string `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Result != "applied" {
		return fmt.Errorf("writer: PUT %s: %s, result %q, %w", u, resp.Status, r.Result, err)
	}
	return nil
}

// histogram is one Prometheus histogram as scraped: cumulative bucket
// counts by upper bound (the last bound is +Inf).
type histogram struct {
	bounds     []float64
	cumulative []float64
	count, sum float64
}

// projectorMetrics is what the latency run reads of a projector's
// /metrics.
type projectorMetrics struct {
	latency histogram // commit -> applied
	batches histogram // converge_projector_batch_seconds: one observation a batch
	events  float64   // converge_projector_events_total, every result
}

func scrapeProjector(b *testing.B, addr string) projectorMetrics {
	b.Helper()
	m := scrapeMetrics(b, addr)
	var pm projectorMetrics
	var err error
	if pm.latency, err = histogramOf(m, commitToApplied); err != nil {
		b.Fatalf("metrics of %s: %v", addr, err)
	}
	if pm.batches, err = histogramOf(m, "converge_projector_batch_seconds"); err != nil {
		b.Fatalf("metrics of %s: %v", addr, err)
	}
	pm.events = m.Sum("converge_projector_events_total", nil)
	return pm
}

// scrapeRelay reads the relay's commit -> acknowledged histogram.
func (s *benchStack) scrapeRelay(b *testing.B) histogram {
	b.Helper()
	h, err := histogramOf(scrapeMetrics(b, s.dev.RelayAddr), "converge_relay_commit_to_ack_seconds")
	if err != nil {
		b.Fatalf("metrics of the relay: %v", err)
	}
	return h
}

func scrapeMetrics(b *testing.B, addr string) telemetry.Metrics {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := telemetry.Scrape(ctx, "http://"+addr+"/metrics")
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// histogramOf reads the histogram name of a scrape. A projector exports
// one series of it (its name is a constant label), and so does the relay.
func histogramOf(m telemetry.Metrics, name string) (histogram, error) {
	h, err := m.Histogram(name, nil)
	if err != nil {
		return histogram{}, err
	}
	return histogram{bounds: h.Bounds, cumulative: h.Cumulative, count: h.Count, sum: h.Sum}, nil
}

// minus is the histogram of the observations made between o and h.
func (h histogram) minus(o histogram) (histogram, error) {
	if !slices.Equal(h.bounds, o.bounds) {
		return histogram{}, errors.New("the histogram's buckets changed between scrapes")
	}
	d := histogram{bounds: h.bounds, cumulative: make([]float64, len(h.bounds)), count: h.count - o.count, sum: h.sum - o.sum}
	for i := range h.cumulative {
		d.cumulative[i] = h.cumulative[i] - o.cumulative[i]
	}
	return d, nil
}

// quantile interpolates the q-quantile linearly within its bucket, as
// Prometheus's histogram_quantile does: the first bucket starts at 0, and
// a quantile in the +Inf bucket is the highest finite bound.
func (h histogram) quantile(q float64) float64 {
	total := h.cumulative[len(h.cumulative)-1]
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	i, _ := slices.BinarySearch(h.cumulative, rank)
	if i >= len(h.bounds)-1 {
		return h.bounds[len(h.bounds)-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.cumulative[i-1]
	}
	return lower + (h.bounds[i]-lower)*(rank-below)/(h.cumulative[i]-below)
}

// bucketOf returns the bounds of the bucket holding the q-quantile and
// the number of observations in it.
func (h histogram) bucketOf(q float64) (lower, upper, count float64) {
	rank := q * h.cumulative[len(h.cumulative)-1]
	i, _ := slices.BinarySearch(h.cumulative, rank)
	i = min(i, len(h.bounds)-1)
	below := 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.cumulative[i-1]
	}
	return lower, h.bounds[i], h.cumulative[i] - below
}

// cpuStalled is the machine's total time, since boot, during which some
// task waited for a CPU (Linux pressure stall information); false where
// the kernel does not report it.
func cpuStalled() (time.Duration, bool) {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n") // "some avg10=... total=<microseconds>"
	_, total, ok := strings.Cut(line, "total=")
	us, err := strconv.ParseInt(strings.TrimSpace(total), 10, 64)
	if !ok || err != nil {
		return 0, false
	}
	return time.Duration(us) * time.Microsecond, true
}

// cpuPressure describes how contended the machine's CPUs were over the
// last elapsed, since cpuStalled said from: the pipeline's own work, and
// whatever else runs on the machine, which the figures then include.
func cpuPressure(from time.Duration, elapsed time.Duration) string {
	to, ok := cpuStalled()
	if !ok || from == 0 {
		return "CPU pressure not reported by this kernel"
	}
	return fmt.Sprintf("CPU pressure: some task of the machine waited for a CPU %.0f%% of the time (PSI, this process, Postgres and anything else)",
		100*(to-from).Seconds()/elapsed.Seconds())
}

func fmtSeconds(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(s*1000, 'g', -1, 64) + " ms"
}

// BenchmarkRebuildIndex times a rebuild: a fresh projector runtime
// converging an empty store to a stream of rebuildDocs events from its
// start, for the embedded index (hash embedder) and for the embedded
// graph. The stream is filled directly, not through Postgres: the point is
// the projector.
func BenchmarkRebuildIndex(b *testing.B) {
	n := envCount(b, envRebuildDocs, defaultRebuildDocs)
	ctx := context.Background()
	ns, err := natsserver.Start(b.TempDir(), -1)
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var refused error // a publish the stream refused
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			refused = errors.Join(refused, err)
			mu.Unlock()
		}))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	fillStart := time.Now()
	chunks, size := fillStream(ctx, b, js, n)
	mu.Lock()
	if refused != nil {
		b.Fatalf("filling the stream: %v", refused)
	}
	mu.Unlock()
	filled := fmt.Sprintf("stream CONVERGE_DOCS filled with %d events (%.2f chunks a document, %.0f bytes an event) in %v",
		n, float64(chunks)/float64(n), float64(size)/float64(n), time.Since(fillStart).Round(time.Millisecond))
	// A benchmark with sub-benchmarks prints no log of its own.
	var once sync.Once

	runs := 0
	// project converges store to the whole stream with a fresh projector
	// runtime (a consumer of its own, deleted afterwards).
	project := func(b *testing.B, what string, store projector.Store) {
		runs++
		name := fmt.Sprintf("rebuild-%s-%d", what, runs)
		r, err := projector.New(js, store, projector.Config{Name: name, StopWhenCaughtUp: true}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Run(ctx); err != nil {
			b.Fatal(err)
		}
		if err := js.DeleteConsumer(ctx, contract.DocsStream, name); err != nil {
			b.Fatal(err)
		}
	}
	rebuild := func(b *testing.B, what string, open func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error)) {
		once.Do(func() { b.Log(filled) })
		var took time.Duration
		for range b.N {
			start := time.Now()
			store, count, closeStore := open(b)
			project(b, what, store)
			took += time.Since(start)
			got, err := count(ctx)
			if err != nil || got != n {
				b.Fatalf("after the rebuild the %s holds %d documents (%v), want %d", what, got, err, n)
			}
			if err := closeStore(); err != nil {
				b.Fatal(err)
			}
		}
		reportRebuild(b, "rebuild of the embedded "+what, n, took)
	}
	b.Run("index", func(b *testing.B) {
		rebuild(b, "index", func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error) {
			e, err := embed.New(embed.Config{})
			if err != nil {
				b.Fatal(err)
			}
			st, err := iembedded.Open(b.TempDir(), iembedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			x, err := index.New(ctx, st, e, index.Options{})
			if err != nil {
				b.Fatal(err)
			}
			count := func(ctx context.Context) (int, error) {
				docs, err := verify.ReadIndex(ctx, st)
				return len(docs), err
			}
			return x, count, st.Close
		})
	})
	// The whole rebuild as converge rebuild index runs it in the projector
	// process: a fresh generation filled by the rebuild consumer, the switch,
	// the previous generation dropped.
	b.Run("index-blue-green", func(b *testing.B) {
		once.Do(func() { b.Log(filled) })
		var took time.Duration
		for range b.N {
			dataDir := b.TempDir()
			stores, err := indexprojector.NewStores(ctx, &indexprojector.Config{DataDir: dataDir}, index.Options{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			sw, rebuilt, stop := rebuildWithManager(ctx, b, js, stores, "index", "bench-index")
			took += rebuilt
			x := sw.Live().Store.(*index.Index)
			docs, err := verify.ReadIndex(ctx, x.Backend().(index.Backend))
			if err != nil || len(docs) != n || sw.Live().Name == "index" {
				b.Fatalf("after the rebuild the live generation %s holds %d documents (%v), want %d in a fresh one", sw.Live().Name, len(docs), err, n)
			}
			stop()
			_ = sw.Close()
			_ = stores.Close()
		}
		reportRebuild(b, "blue/green rebuild (fill, switch, drop) of the embedded index", n, took)
	})
	b.Run("graph", func(b *testing.B) {
		rebuild(b, "graph", func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error) {
			st, err := gembedded.Open(b.TempDir(), gembedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			p, err := graph.New(ctx, st)
			if err != nil {
				b.Fatal(err)
			}
			count := func(ctx context.Context) (int, error) {
				docs, err := verify.ReadGraph(ctx, st)
				return len(docs), err
			}
			return p, count, st.Close
		})
	})
	// The graph in Neo4j (the project's test server): first the projector
	// runtime filling an emptied database from the stream's start, then the
	// rebuild as converge rebuild graph runs it there, in place: the wipe of
	// the full graph, the fill, the activation.
	b.Run("graph-neo4j", func(b *testing.B) {
		once.Do(func() { b.Log(filled) })
		n4 := testenv.LeaseNeo4j(b)
		cfg := graphprojector.Config{Neo4jURL: n4.URL, Neo4jUser: n4.User, Neo4jPassword: n4.Password, Neo4jDatabase: "neo4j",
			Neo4jBatch: 100}
		var fill, rebuilt time.Duration
		for range b.N {
			backend, err := neo4j.New(ctx, neo4j.Config{URL: n4.URL, User: n4.User, Password: n4.Password})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := backend.Wipe(ctx); err != nil {
				b.Fatal(err)
			}
			p, err := graph.New(ctx, backend)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			project(b, "graph-neo4j", p)
			fill += time.Since(start)
			if docs, err := verify.ReadGraph(ctx, backend); err != nil || len(docs) != n {
				b.Fatalf("after the fill Neo4j holds %d documents (%v), want %d", len(docs), err, n)
			}
			_ = backend.Close()

			c := cfg
			c.DataDir = b.TempDir()
			stores := graphprojector.NewStores(&c, nil)
			sw, took, stop := rebuildWithManager(ctx, b, js, stores, "neo4j", "bench-graph")
			rebuilt += took
			g := sw.Live().Store.(*graph.Projection)
			if docs, err := verify.ReadGraph(ctx, g.Backend()); err != nil || len(docs) != n {
				b.Fatalf("after the rebuild in place Neo4j holds %d documents (%v), want %d", len(docs), err, n)
			}
			stop()
			_ = sw.Close()
		}
		per := fill / time.Duration(b.N)
		b.ReportMetric(float64(n)/per.Seconds(), "fill_docs/s")
		b.Logf("the projector runtime filling an empty Neo4j from %d events: %v, %.0f docs/s (absolute, this machine)",
			n, per.Round(time.Millisecond), float64(n)/per.Seconds())
		reportRebuild(b, "rebuild in place (wipe of the full graph, fill) of the graph in Neo4j", n, rebuilt)
	})
}

// rebuildWithManager runs one whole rebuild as a projector process does:
// a rebuild.Manager over stores, whose live generation is live, started
// as soon as it takes a rebuild and waited for until done. It returns the
// switch (with the rebuilt generation live), how long the rebuild took,
// and stop, which ends the manager.
func rebuildWithManager(ctx context.Context, b *testing.B, js jetstream.JetStream, stores rebuildpkg.Stores, live, name string) (*rebuildpkg.Switch, time.Duration, func()) {
	b.Helper()
	g, err := stores.Open(ctx, live)
	if err != nil {
		b.Fatal(err)
	}
	sw := rebuildpkg.NewSwitch(g)
	m, err := rebuildpkg.NewManager(rebuildpkg.Config{Runtime: projector.Config{Name: name}}, stores, sw, nil)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(runCtx, js) }()
	start := time.Now()
	for {
		if _, _, err := m.Start(ctx); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // the manager is still connecting
	}
	lastErr, phase, phaseAt := "", "", start
	for st := m.Status(ctx); ; st = m.Status(ctx) {
		if st.Phase != phase {
			// Where a rebuild's time goes: each phase's share, in the log.
			if phase != "" {
				b.Logf("rebuild %s: phase %s took %v", name, phase, time.Since(phaseAt).Round(time.Millisecond))
			}
			phase, phaseAt = st.Phase, time.Now()
		}
		if st.Phase == rebuildpkg.PhaseDone {
			break
		}
		if st.Error != "" && st.Error != lastErr {
			b.Logf("rebuild: %s", st.Error)
			lastErr = st.Error
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	return sw, took, func() { cancel(); <-done }
}

// reportRebuild reports the rebuilds of n documents that took took over
// b.N runs, against the target for rebuildTargetDocs.
func reportRebuild(b *testing.B, what string, n int, took time.Duration) {
	b.Helper()
	per := took / time.Duration(b.N)
	rate := float64(n) / per.Seconds()
	projected := time.Duration(float64(rebuildTargetDocs) / rate * float64(time.Second))
	verdict := "met"
	if projected >= rebuildTarget {
		verdict = "NOT MET"
	}
	b.ReportMetric(per.Seconds(), "rebuild_s")
	b.ReportMetric(rate, "docs/s")
	b.Logf("%s from %d events: %v, %.0f docs/s; %d documents take %v at this rate; target < %v for %d: %s (%.2f of the target)",
		what, n, per.Round(time.Millisecond), rate, rebuildTargetDocs, projected.Round(time.Millisecond), rebuildTarget, rebuildTargetDocs,
		verdict, projected.Seconds()/rebuildTarget.Seconds())
	benchsummary.Log(b, benchsummary.Row{Target: fmt.Sprintf("%s, %d documents", what, rebuildTargetDocs),
		Figure: projected.Round(100 * time.Millisecond).String(), Limit: rebuildTarget.String(), Ratio: projected.Seconds() / rebuildTarget.Seconds(),
		Goal: "< 1", Met: projected < rebuildTarget})
}

// fillStream publishes n upserted events of ~1 KB documents (one or two
// chunks by the writer's chunker, two or three links, two tags)
// asynchronously, as the relay does (Nats-Msg-Id = the event id), and
// returns the number of chunks and of encoded bytes. A publish the stream
// refuses goes to js's error handler.
func fillStream(ctx context.Context, b *testing.B, js jetstream.JetStream, n int) (chunks, size int) {
	b.Helper()
	words := strings.Fields("river delta glacier forest coral reef bird nest compiler parser token network packet router " +
		"telescope mirror comet orbit harbour pier crane ship cargo lava magma crater basalt canopy fern moss")
	for i := range n {
		rng := rand.New(rand.NewPCG(uint64(i), 7)) //nolint:gosec // reproducible text, not a secret
		var body strings.Builder
		want := 700 + rng.IntN(700) // one chunk below the chunker's 1024-byte target, two above
		for body.Len() < want {
			for range 10 + rng.IntN(10) {
				body.WriteString(words[rng.IntN(len(words))])
				body.WriteByte(' ')
			}
			body.WriteString(strconv.Itoa(i))
			body.WriteString(".\n\n")
		}
		key := fmt.Sprintf("rebuild/%07d", i)
		links := []string{fmt.Sprintf("rebuild/%07d", (i+1)%n), fmt.Sprintf("rebuild/%07d", rng.IntN(n))}
		if i%3 == 0 {
			links = append(links, fmt.Sprintf("external/%d", i%500))
		}
		d, err := contract.Document{Key: key, Version: 1, Title: "Rebuild document " + strconv.Itoa(i), Body: body.String(),
			Links: links, Tags: []string{"rebuild", "t" + strconv.Itoa(i%32)}, Meta: json.RawMessage(`{"source":"converge bench"}`)}.Normalize()
		if err != nil {
			b.Fatal(err)
		}
		ev := contract.NewUpsertedEvent(d, chunking.Split(d.Body, chunking.DefaultConfig()))
		data, err := ev.Encode()
		if err != nil {
			b.Fatal(err)
		}
		chunks += len(ev.Chunks)
		size += len(data)
		m := nats.NewMsg(contract.Subject(key))
		m.Data = data
		for {
			_, err := js.PublishMsgAsync(m, jetstream.WithMsgID(ev.ID.String()))
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				<-js.PublishAsyncComplete()
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	case <-time.After(2 * time.Minute):
		b.Fatal("the stream's acknowledgements did not arrive within 2 minutes")
	}
	return chunks, size
}

// The benchmarks' histogram arithmetic, checked against values computed
// by hand the way Prometheus's histogram_quantile computes them.
func TestBenchHistogram(t *testing.T) {
	inf := math.Inf(1)
	h := histogram{bounds: []float64{0.001, 0.002, 0.004, inf}, cumulative: []float64{10, 30, 40, 50}}
	before := histogram{bounds: h.bounds, cumulative: []float64{0, 0, 0, 10}}
	d, err := h.minus(before)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		h    histogram
		q    float64
		want float64
	}{
		{d, 0.25, 0.001},   // rank 10: the top of the first bucket, which starts at 0
		{d, 0.5, 0.0015},   // rank 20: halfway through (1 ms, 2 ms]
		{d, 0.99, 0.00392}, // rank 39.6: 9.6 of the 10 events of (2 ms, 4 ms]
		{h, 0.99, 0.004},   // rank 49.5, in +Inf: the highest finite bound
	} {
		if got := c.h.quantile(c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile(%v) of %v = %v, want %v", c.q, c.h.cumulative, got, c.want)
		}
	}
	if lo, hi, n := d.bucketOf(0.99); lo != 0.002 || hi != 0.004 || n != 10 {
		t.Errorf("bucketOf(0.99) = (%v, %v] of %v, want (0.002, 0.004] of 10", lo, hi, n)
	}
	if got := exactQuantile([]time.Duration{1 * time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond}, 0.5); got != 0.003 {
		t.Errorf("exactQuantile(0.5) of 1..4 ms = %v, want 0.003", got)
	}
	if _, err := h.minus(histogram{bounds: []float64{1, inf}}); err == nil {
		t.Error("subtracting histograms of other buckets must fail")
	}
	text := "# TYPE x histogram\nx_bucket{projector=\"index\",le=\"0.001\"} 3\nx_bucket{projector=\"index\",le=\"+Inf\"} 4\nx_sum{projector=\"index\"} 0.5\nx_count{projector=\"index\"} 4\nxy_total 9\n"
	m, err := telemetry.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	p, err := histogramOf(m, "x")
	if err != nil || !slices.Equal(p.bounds, []float64{0.001, inf}) || !slices.Equal(p.cumulative, []float64{3, 4}) || p.sum != 0.5 || p.count != 4 {
		t.Errorf("histogramOf = %+v, %v", p, err)
	}
}
