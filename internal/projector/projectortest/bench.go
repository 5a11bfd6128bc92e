// Package projectortest holds what the projectors' benchmarks share: a
// stream prefilled with events, a run of the projector runtime over it
// until it has caught up, and the comparison of that run with its store's
// raw write of the same data, side by side in one run.
package projectortest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Target is the least ratio of a projector's rate to its store's raw write
// that the projectors' benchmarks aim at.
const Target = 0.5

// Prefill starts a NATS server for b, creates the documents' stream and
// stores every event in it, each on its document's subject, before it
// returns.
func Prefill(b testing.TB, evs []contract.Event) jetstream.JetStream {
	b.Helper()
	ctx := context.Background()
	js, err := jetstream.New(testenv.StartNATS(b).Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: contract.DocsStream,
		Subjects: []string{contract.DocsSubjectPrefix + ">"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	for _, ev := range evs {
		data, err := ev.Encode()
		if err != nil {
			b.Fatal(err)
		}
		m := nats.NewMsg(contract.Subject(ev.Key))
		m.Data = data
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing the events took over a minute")
	}
	return js
}

// Project times the projector runtime, with its default configuration and
// a new durable consumer of the given name, applying the whole stream of
// js to store, from the consumer's creation until nothing is pending.
func Project(b testing.TB, js jetstream.JetStream, name string, store projector.Store) time.Duration {
	b.Helper()
	r, err := projector.New(js, store, projector.Config{Name: name, StopWhenCaughtUp: true}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := r.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// Round is one measurement of each side, taken one after the other.
type Round struct {
	Projector, Raw time.Duration
}

// Comparison collects the rounds of a projector against its store's raw
// write of the same data: N units (documents, points) on each side of each
// round.
type Comparison struct {
	Name   string  // what is compared, for the log line
	Unit   string  // what N counts ("docs", "points")
	N      float64 // units written by each side in a round
	rounds []Round
}

// Add records a round.
func (c *Comparison) Add(r Round) { c.rounds = append(c.rounds, r) }

// Report reports the medians of the rounds' rates and of their ratios
// (the ratio of each round is taken between its own two sides, which ran
// back to back, so that the machine's load swings cancel out as much as
// they can), and logs them in one line with the target.
func (c *Comparison) Report(b *testing.B, prefix string) {
	b.Helper()
	if len(c.rounds) == 0 {
		return
	}
	var proj, raw, ratio []float64
	for _, r := range c.rounds {
		p, w := c.N/r.Projector.Seconds(), c.N/r.Raw.Seconds()
		proj, raw, ratio = append(proj, p), append(raw, w), append(ratio, p/w)
	}
	p, w, q := median(proj), median(raw), median(ratio)
	b.ReportMetric(p, prefix+c.Unit+"/s")
	b.ReportMetric(w, prefix+"raw_"+c.Unit+"/s")
	b.ReportMetric(q, prefix+"ratio")
	verdict := "MET"
	if q < Target {
		verdict = "MISSED"
	}
	b.Logf("%s: projector %.0f %s/s, raw write %.0f %s/s, ratio %.3f (target >= %.1f: %s); medians of %d rounds, ratios %s",
		c.Name, p, c.Unit, w, c.Unit, q, Target, verdict, len(c.rounds), fmtRatios(ratio))
	benchsummary.Log(b, benchsummary.Row{Target: "projector / its store's raw write, " + c.Name,
		Figure: fmt.Sprintf("%.0f %s/s", p, c.Unit), Limit: fmt.Sprintf("%.0f %s/s", w, c.Unit), Ratio: q,
		Goal: fmt.Sprintf(">= %.1f", Target), Met: q >= Target})
}

// Log logs the medians and their ratio in one line, without a target: a
// figure kept beside the compared one (a former baseline, say).
func (c *Comparison) Log(b *testing.B) {
	b.Helper()
	if len(c.rounds) == 0 {
		return
	}
	var proj, raw, ratio []float64
	for _, r := range c.rounds {
		p, w := c.N/r.Projector.Seconds(), c.N/r.Raw.Seconds()
		proj, raw, ratio = append(proj, p), append(raw, w), append(ratio, p/w)
	}
	b.Logf("%s: projector %.0f %s/s, raw write %.0f %s/s, ratio %.3f; medians of %d rounds, ratios %s",
		c.Name, median(proj), c.Unit, median(raw), c.Unit, median(ratio), len(c.rounds), fmtRatios(ratio))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fmtRatios(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%.2f", x)
	}
	return out
}
