// The benchmarks' figures: the services' histograms as scraped, their
// quantiles, exact quantiles, and the machine's CPU pressure.

package stack_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/telemetry"
)

const commitToApplied = "converge_projector_commit_to_applied_seconds"

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

func scrapeProjector(b testing.TB, addr string) projectorMetrics {
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

func scrapeMetrics(b testing.TB, addr string) telemetry.Metrics {
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
