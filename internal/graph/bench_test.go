package graph_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

const benchDocs = 5000

// benchEvents are benchDocs documents with 4 chunks, 3 links (some to
// keys never written: stubs) and 2 tags each.
func benchEvents(b *testing.B) []contract.Event {
	b.Helper()
	chunks := func(i int) []string {
		return []string{fmt.Sprintf("chunk a of %d ", i), "chunk b ", "chunk c ", "chunk d"}
	}
	docs := corpus.Sequential(benchDocs, corpus.Shape{
		Title: corpus.Fixed("bench"),
		Body:  func(i int) string { return strings.Join(chunks(i), "") },
		Links: func(i int) []string {
			return []string{fmt.Sprintf("doc-%d", (i+1)%benchDocs), fmt.Sprintf("doc-%d", (i*7)%benchDocs), fmt.Sprintf("ext-%d", i%100)}
		},
		Tags: func(i int) []string { return []string{fmt.Sprint("t", i%10), "bench"} },
	})
	evs := make([]contract.Event, len(docs))
	for i, d := range docs {
		evs[i] = contract.NewUpsertedEvent(d, chunks(i))
	}
	return evs
}

// benchRounds is how many rounds of each side one iteration of
// BenchmarkProjector measures, alternating their order.
const benchRounds = 3

// BenchmarkProjector measures, in one run, the graph projector end to end
// (events in a JetStream stream -> runtime -> decode and verify ->
// embedded graph, with its guard, replacement and count fence) and the
// embedded graph's raw Apply of the same documents in batches of 256 (the
// limit), and reports the ratio.
func BenchmarkProjector(b *testing.B) {
	evs := benchEvents(b)
	docs := make([]graph.Doc, len(evs))
	for i := range evs {
		docs[i] = graph.FromEvent(&evs[i])
	}
	js := projectortest.Prefill(b, evs)
	c := projectortest.Comparison{Name: "embedded graph", Unit: "docs", N: benchDocs}
	run := 0
	for range b.N {
		for round := range benchRounds {
			var r projectortest.Round
			sides := []func(){
				func() { r.Raw = rawApply(b, docs) },
				func() { run++; r.Projector = project(b, js, fmt.Sprintf("bench-%d", run), evs) },
			}
			if round%2 == 1 {
				slices.Reverse(sides)
			}
			for _, side := range sides {
				side()
			}
			c.Add(r)
		}
	}
	c.Report(b, "")
	b.Logf("embedded graph: %d documents, 4 chunks, 3 links, 2 tags each", benchDocs)
}

func open(b *testing.B) *embedded.Store {
	s, err := embedded.Open(b.TempDir(), embedded.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func rawApply(b *testing.B, docs []graph.Doc) time.Duration {
	b.Helper()
	s := open(b)
	defer s.Close()
	start := time.Now()
	for i := 0; i < len(docs); i += 256 {
		if _, err := s.Apply(context.Background(), docs[i:min(i+256, len(docs))]); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func project(b *testing.B, js jetstream.JetStream, name string, evs []contract.Event) time.Duration {
	b.Helper()
	ctx := context.Background()
	s := open(b)
	defer s.Close()
	p, err := graph.New(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	elapsed := projectortest.Project(b, js, name, p)
	if v, ok, err := s.Document(ctx, evs[len(evs)-1].Key); err != nil || !ok || v.Version != 1 {
		b.Fatalf("after the run: %+v %v %v", v, ok, err)
	}
	return elapsed
}
