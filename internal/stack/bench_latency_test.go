// The latency runs of BenchmarkEndToEnd: writes paced open loop, and
// each stage's latency from commit: stored in JetStream, acknowledged to
// the relay, applied by each projector.

package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/pkg/contract"
)

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
