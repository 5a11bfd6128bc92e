// The end-to-end benchmarks of `make bench`: the whole pipeline in this
// process (stack.Start: a throwaway PostgreSQL 15, embedded NATS, the
// writer, the relay, the embedded index and graph projectors), or in the
// deployed layout, a process each; their throughput and calibration runs.

package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	envBenchDocs    = "CONVERGE_BENCH_DOCS"          // documents of the throughput run
	envLatencyRate  = "CONVERGE_BENCH_LATENCY_RATE"  // documents/s of the latency runs; default half the end-to-end rate
	envLatencyBatch = "CONVERGE_BENCH_LATENCY_BATCH" // documents per request of the latency run

	defaultBenchDocs      = 20000
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
