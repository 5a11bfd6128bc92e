package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ErrNoSeries is the error of a read that no series of the scrape
// matches: the metric is not exported, or a vector has not counted under
// those labels yet.
var ErrNoSeries = errors.New("telemetry: no such series")

// Labels selects series: a series matches when it has each of these label
// values; labels it has beyond them do not matter. Nil selects every series.
type Labels map[string]string

// Metrics is one scrape of a /metrics endpoint, read with expfmt: its metric
// families by name.
type Metrics struct {
	families map[string]*dto.MetricFamily
}

// Scrape GETs the /metrics endpoint at url, asking for the Prometheus text
// format, and parses the answer.
func Scrape(ctx context.Context, url string) (Metrics, error) {
	return ScrapeWith(ctx, http.DefaultClient, url)
}

// maxScrape bounds the exposition a scrape reads.
const maxScrape = 32 << 20

// ScrapeWith is [Scrape] through client (a TLS configuration of its own).
func ScrapeWith(ctx context.Context, client *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("telemetry: scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("telemetry: scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("telemetry: scrape %s: %s", url, resp.Status)
	}
	if f := expfmt.ResponseFormat(resp.Header); f.FormatType() != expfmt.TypeTextPlain {
		return Metrics{}, fmt.Errorf("telemetry: scrape %s: answered %q, not the text format", url, resp.Header.Get("Content-Type"))
	}
	m, err := Parse(io.LimitReader(resp.Body, maxScrape))
	if err != nil {
		return Metrics{}, fmt.Errorf("telemetry: scrape %s: %w", url, err)
	}
	return m, nil
}

// Parse reads a Prometheus text exposition.
func Parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("telemetry: parse metrics: %w", err)
	}
	return Metrics{families: families}, nil
}

// Value is the value of the one counter, gauge or untyped series of name
// that labels select. None is [ErrNoSeries]; several are an error too, since
// adding them up is [Metrics.Sum]'s decision, not a reader's by accident.
func (m Metrics) Value(name string, labels Labels) (float64, error) {
	s, err := m.series(name, labels)
	if err != nil {
		return 0, err
	}
	switch {
	case s.Counter != nil:
		return s.Counter.GetValue(), nil
	case s.Gauge != nil:
		return s.Gauge.GetValue(), nil
	case s.Untyped != nil:
		return s.Untyped.GetValue(), nil
	}
	return 0, fmt.Errorf("telemetry: %s is a %s, not a counter or gauge", name, m.families[name].GetType())
}

// Sum adds up the counter, gauge or untyped series of name that labels
// select: 0 when there are none (a vector that has not counted yet
// exports no series).
func (m Metrics) Sum(name string, labels Labels) float64 {
	var sum float64
	for _, s := range m.families[name].GetMetric() {
		if !matches(s, labels) {
			continue
		}
		switch {
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Untyped != nil:
			sum += s.Untyped.GetValue()
		}
	}
	return sum
}

// Histogram is one series of a Prometheus histogram as scraped.
type Histogram struct {
	// Bounds are the buckets' upper bounds, increasing; the last is +Inf.
	Bounds []float64
	// Cumulative is the number of observations at most each bound.
	Cumulative []float64
	// Count and Sum are the number of observations and their sum.
	Count, Sum float64
}

// Histogram is the one histogram series of name that labels select (the
// bucket label le is not one of a series' labels). None is [ErrNoSeries].
func (m Metrics) Histogram(name string, labels Labels) (Histogram, error) {
	s, err := m.series(name, labels)
	if err != nil {
		return Histogram{}, err
	}
	dh := s.GetHistogram()
	if dh == nil {
		return Histogram{}, fmt.Errorf("telemetry: %s is a %s, not a histogram", name, m.families[name].GetType())
	}
	h := Histogram{Sum: dh.GetSampleSum(), Count: dh.GetSampleCountFloat()}
	if h.Count == 0 {
		h.Count = float64(dh.GetSampleCount())
	}
	for _, b := range dh.GetBucket() {
		n := b.GetCumulativeCountFloat()
		if n == 0 {
			n = float64(b.GetCumulativeCount())
		}
		h.Bounds = append(h.Bounds, b.GetUpperBound())
		h.Cumulative = append(h.Cumulative, n)
	}
	// The text format lists the +Inf bucket; the protobuf one leaves it to
	// the count. Either way a reader finds it last.
	if len(h.Bounds) == 0 || !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
		h.Bounds = append(h.Bounds, math.Inf(1))
		h.Cumulative = append(h.Cumulative, h.Count)
	}
	return h, nil
}

// series is the one series of name that labels select.
func (m Metrics) series(name string, labels Labels) (*dto.Metric, error) {
	var found []*dto.Metric
	for _, s := range m.families[name].GetMetric() {
		if matches(s, labels) {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: %s%s", ErrNoSeries, name, labelText(labels))
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("telemetry: %d series of %s match %s; select one by its labels", len(found), name, labelText(labels))
}

func matches(s *dto.Metric, labels Labels) bool {
	for k, v := range labels {
		have := "" // as in a PromQL selector, an absent label is ""
		for _, p := range s.GetLabel() {
			if p.GetName() == k {
				have = p.GetValue()
				break
			}
		}
		if have != v {
			return false
		}
	}
	return true
}

// labelText is labels as in a selector, {a="1",b="2"}, sorted by name.
func labelText(labels Labels) string {
	if len(labels) == 0 {
		return "{}"
	}
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, fmt.Sprintf("%s=%q", k, v))
	}
	slices.Sort(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}
