package index_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/embed/embedtest"
	"github.com/converge-sync/converge/internal/embed/latencytest"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// embedTarget is the share of its embedder's own throughput the index
// projector reaches, embedding every chunk.
const embedTarget = 0.9

// BenchmarkProjectorKeepsTheEmbedderBusy measures, for each embedder, the
// index projector end to end (the stream, the runtime's shards, the
// embedder's requests, the embedded index), as the service runs it with a
// remote embedder (embedding the next batch ahead), against the
// embedder's own throughput at the same batch size and concurrency: every
// chunk text of the corpus in one call, which keeps that many requests in
// flight from start to end. The projector without embedding ahead is
// measured in the same rounds, and logged beside. Embedders: the local model server of the tests (when
// installed), and endpoints answering after a fixed 20 ms and 100 ms (a
// remote model).
func BenchmarkProjectorKeepsTheEmbedderBusy(b *testing.B) {
	evs := uniqueChunkEvents()
	var texts []string
	seen := map[string]bool{}
	for _, ev := range evs {
		for _, c := range ev.Chunks {
			texts = append(texts, c.Text)
			if seen[c.Hash] {
				b.Fatalf("chunk text of %s repeated: the embedder would be asked less than the corpus holds", ev.Key)
			}
			seen[c.Hash] = true
		}
	}
	for _, s := range []struct {
		name  string
		model string
		dim   int
		url   func(b testing.TB) string
	}{
		{"latency-20ms", "fixed-latency", benchDim, func(b testing.TB) string { return latencytest.Start(b, 20*time.Millisecond, benchDim).URL }},
		{"latency-100ms", "fixed-latency", benchDim, func(b testing.TB) string { return latencytest.Start(b, 100*time.Millisecond, benchDim).URL }},
		{"local-model", embedtest.Model256, 256, embedtest.Start},
	} {
		b.Run(s.name, func(b *testing.B) {
			cfg := embed.HTTPConfig{URL: s.url(b), Model: s.model, Dimension: s.dim,
				BatchSize: embed.DefaultBatchSize, Concurrency: embed.DefaultConcurrency}
			newEmbedder := func() *embed.HTTP {
				e, err := embed.NewHTTP(cfg)
				if err != nil {
					b.Fatal(err)
				}
				return e
			}
			js := projectortest.Prefill(b, evs)
			var ratios, proj, raw, behind []float64
			run := 0
			for range b.N {
				for round := range benchRounds {
					var own, projected, noAhead time.Duration
					sides := []func(){
						func() {
							start := time.Now()
							if _, err := newEmbedder().Embed(context.Background(), texts); err != nil {
								b.Fatal(err)
							}
							own = time.Since(start)
						},
						func() {
							be, err := embedded.Open(b.TempDir(), embedded.Options{})
							if err != nil {
								b.Fatal(err)
							}
							projected = projectWith(b, js, &run, be, newEmbedder(), evs, index.Options{EmbedAhead: true})
						},
						func() {
							be, err := embedded.Open(b.TempDir(), embedded.Options{})
							if err != nil {
								b.Fatal(err)
							}
							noAhead = project(b, js, &run, be, newEmbedder(), evs)
						},
					}
					if round%2 == 1 {
						slices.Reverse(sides)
					}
					for _, side := range sides {
						side()
					}
					n := float64(len(texts))
					proj, raw, ratios = append(proj, n/projected.Seconds()), append(raw, n/own.Seconds()), append(ratios, own.Seconds()/projected.Seconds())
					behind = append(behind, own.Seconds()/noAhead.Seconds())
				}
			}
			p, w, q := medianOf(proj), medianOf(raw), medianOf(ratios)
			b.ReportMetric(p, "chunks/s")
			b.ReportMetric(w, "embedder_chunks/s")
			b.ReportMetric(q, "ratio")
			verdict := "MET"
			if q < embedTarget {
				verdict = "MISSED"
			}
			b.Logf("%s: projector %.0f chunks/s, the embedder's own %.0f chunks/s (batch %d, concurrency %d), ratio %.3f (target >= %.1f: %s); ratios %.2f; without embedding ahead, ratio %.3f (%.2f)",
				s.name, p, w, cfg.BatchSize, cfg.Concurrency, q, embedTarget, verdict, ratios, medianOf(behind), behind)
			benchsummary.Log(b, benchsummary.Row{Target: "index projector / its embedder's own throughput, " + s.name,
				Figure: fmt.Sprintf("%.0f chunks/s", p), Limit: fmt.Sprintf("%.0f chunks/s", w), Ratio: q,
				Goal: fmt.Sprintf(">= %.1f", embedTarget), Met: q >= embedTarget})
		})
	}
}

// uniqueChunkEvents are benchDocs documents of four 1 KB chunks, no two
// chunks of the same text (a chunk's vector is embedded once however many
// chunks share its text).
func uniqueChunkEvents() []contract.Event {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while projectors converge every store to postgres")
	return corpus.UpsertedEvents(corpus.Sequential(benchDocs, corpus.Shape{Title: corpus.Fixed("bench"),
		Body: func(i int) string {
			var body strings.Builder
			for p := range 4 {
				fmt.Fprintf(&body, "Document %d, part %d:", i, p)
				for w := 0; body.Len() < (p+1)*1000; w++ {
					body.WriteString(" " + words[(i+p+w)%len(words)])
				}
				body.WriteString("\n\n")
			}
			return body.String()
		}}))
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
