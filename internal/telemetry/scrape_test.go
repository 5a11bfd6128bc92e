package telemetry_test

import (
	"context"
	"errors"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/telemetry"
)

// A registry served by Handler reads back, through Scrape, as it was
// counted: counters, gauges, labelled vectors and histograms.
func TestScrape(t *testing.T) {
	reg := telemetry.NewRegistry()
	applied := prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_test_applied_total", Help: "test"})
	pending := prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_test_pending", Help: "test"})
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_test_events_total", Help: "test",
		ConstLabels: prometheus.Labels{"projector": "index"}}, []string{"result"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "converge_test_seconds", Help: "test",
		Buckets: []float64{0.001, 0.01, 0.1}}, []string{"stage"})
	reg.MustRegister(applied, pending, events, latency)
	applied.Add(3)
	pending.Set(-2.5)
	events.WithLabelValues("applied").Add(7)
	events.WithLabelValues("skipped").Add(2)
	for _, v := range []float64{0.0005, 0.001, 0.005, 0.05, 0.05, 3} {
		latency.WithLabelValues("commit").Observe(v)
	}
	latency.WithLabelValues("ack").Observe(0.02)

	srv := httptest.NewServer(telemetry.Handler(reg))
	defer srv.Close()
	m, err := telemetry.Scrape(context.Background(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name   string
		labels telemetry.Labels
		want   float64
	}{
		{"converge_test_applied_total", nil, 3},
		{"converge_test_pending", nil, -2.5},
		{"converge_test_events_total", telemetry.Labels{"result": "skipped"}, 2},
		{"converge_test_events_total", telemetry.Labels{"result": "applied", "projector": "index"}, 7},
	} {
		if got, err := m.Value(c.name, c.labels); err != nil || got != c.want {
			t.Errorf("Value(%s, %v) = %v, %v; want %v", c.name, c.labels, got, err, c.want)
		}
	}
	if n, err := m.Value("go_goroutines", nil); err != nil || n < 1 {
		t.Errorf("go_goroutines = %v, %v: the runtime collector's metrics are read too", n, err)
	}
	for _, c := range []struct {
		name   string
		labels telemetry.Labels
	}{
		{"converge_test_missing_total", nil},
		{"converge_test_events_total", telemetry.Labels{"result": "superseded"}},
		{"converge_test_events_total", telemetry.Labels{"projector": "graph"}},
	} {
		if _, err := m.Value(c.name, c.labels); !errors.Is(err, telemetry.ErrNoSeries) {
			t.Errorf("Value(%s, %v): %v, want ErrNoSeries", c.name, c.labels, err)
		}
	}
	if _, err := m.Value("converge_test_events_total", nil); err == nil || errors.Is(err, telemetry.ErrNoSeries) {
		t.Errorf("Value of two series without labels to tell them apart: %v, want an ambiguity error", err)
	}
	if _, err := m.Value("converge_test_seconds", telemetry.Labels{"stage": "ack"}); err == nil {
		t.Error("Value of a histogram must fail")
	}

	for _, c := range []struct {
		name   string
		labels telemetry.Labels
		want   float64
	}{
		{"converge_test_events_total", nil, 9},
		{"converge_test_events_total", telemetry.Labels{"projector": "index"}, 9},
		{"converge_test_events_total", telemetry.Labels{"result": "skipped"}, 2},
		{"converge_test_events_total", telemetry.Labels{"projector": "graph"}, 0},
		{"converge_test_missing_total", nil, 0},
	} {
		if got := m.Sum(c.name, c.labels); got != c.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	h, err := m.Histogram("converge_test_seconds", telemetry.Labels{"stage": "commit"})
	if err != nil {
		t.Fatal(err)
	}
	inf := math.Inf(1)
	// le 0.001 holds 0.0005 and 0.001 (bounds are inclusive); 0.01 adds
	// 0.005; 0.1 the two 0.05; +Inf the 3.
	if !slices.Equal(h.Bounds, []float64{0.001, 0.01, 0.1, inf}) || !slices.Equal(h.Cumulative, []float64{2, 3, 5, 6}) ||
		h.Count != 6 || math.Abs(h.Sum-3.1065) > 1e-12 {
		t.Errorf("Histogram = %+v", h)
	}
	if h, err := m.Histogram("converge_test_seconds", telemetry.Labels{"stage": "ack"}); err != nil ||
		!slices.Equal(h.Cumulative, []float64{0, 0, 1, 1}) || h.Count != 1 || h.Sum != 0.02 {
		t.Errorf("Histogram of stage ack = %+v, %v", h, err)
	}
	if _, err := m.Histogram("converge_test_seconds", nil); err == nil {
		t.Error("Histogram of two series without labels to tell them apart must fail")
	}
	if _, err := m.Histogram("converge_test_seconds", telemetry.Labels{"stage": "none"}); !errors.Is(err, telemetry.ErrNoSeries) {
		t.Errorf("Histogram of a stage never observed: %v, want ErrNoSeries", err)
	}
	if _, err := m.Histogram("converge_test_applied_total", nil); err == nil {
		t.Error("Histogram of a counter must fail")
	}

	if _, err := telemetry.Scrape(context.Background(), srv.URL+"/nothing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Scrape of a missing endpoint: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := telemetry.Scrape(ctx, srv.URL+"/metrics"); !errors.Is(err, context.Canceled) {
		t.Errorf("Scrape with an ended context: %v", err)
	}
}

// Parse reads text in hand: a histogram with a constant label, an untyped
// sample; malformed text is an error.
func TestParse(t *testing.T) {
	text := "# TYPE x histogram\n" +
		"x_bucket{projector=\"index\",le=\"0.001\"} 3\n" +
		"x_bucket{projector=\"index\",le=\"+Inf\"} 4\n" +
		"x_sum{projector=\"index\"} 0.5\n" +
		"x_count{projector=\"index\"} 4\n" +
		"xy_total 9\n"
	m, err := telemetry.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Histogram("x", nil)
	if err != nil || !slices.Equal(h.Bounds, []float64{0.001, math.Inf(1)}) || !slices.Equal(h.Cumulative, []float64{3, 4}) ||
		h.Sum != 0.5 || h.Count != 4 {
		t.Errorf("Histogram = %+v, %v", h, err)
	}
	if v, err := m.Value("xy_total", nil); err != nil || v != 9 {
		t.Errorf("an untyped sample: %v, %v", v, err)
	}
	if _, err := telemetry.Parse(strings.NewReader("x{le=\"1\" 3\n")); err == nil {
		t.Error("Parse of malformed text must fail")
	}
}

// No text makes Parse or a read of what it parsed panic.
func FuzzParse(f *testing.F) {
	f.Add("# TYPE x histogram\nx_bucket{le=\"0.1\"} 1\nx_bucket{le=\"+Inf\"} 2\nx_sum 0.3\nx_count 2\n")
	f.Add("# TYPE c_total counter\nc_total{a=\"1\"} 3\nc_total{a=\"2\"} 4\n")
	f.Add("# TYPE g gauge\ng -1.5e3\n# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n")
	f.Add("u NaN\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := telemetry.Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		for _, name := range []string{"x", "c_total", "g", "s", "u"} {
			_, _ = m.Value(name, nil)
			_ = m.Sum(name, telemetry.Labels{"a": "1"})
			if h, err := m.Histogram(name, nil); err == nil {
				if len(h.Bounds) != len(h.Cumulative) || !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
					t.Fatalf("histogram %s: %+v", name, h)
				}
			}
		}
	})
}
