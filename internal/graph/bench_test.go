package graph_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
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

// BenchmarkProjector measures, in one run, the graph projector end to end
// (events in a JetStream stream -> runtime -> embedded graph) and the
// embedded graph's raw Apply rate of the same documents in batches of 256
// (the limit), and reports the ratio.
func BenchmarkProjector(b *testing.B) {
	evs := benchEvents(b)
	var rawTime, projTime time.Duration
	for range b.N {
		rawTime += rawApply(b, evs)
		projTime += project(b, evs)
	}
	n := float64(b.N) * benchDocs
	raw, proj := n/rawTime.Seconds(), n/projTime.Seconds()
	b.ReportMetric(proj, "docs/s")
	b.ReportMetric(raw, "raw_docs/s")
	b.ReportMetric(proj/raw, "ratio")
	b.Logf("embedded graph: projector %.0f docs/s; raw Apply %.0f docs/s; ratio %.2f (%d documents, 4 chunks, 3 links, 2 tags each)",
		proj, raw, proj/raw, benchDocs)
}

func open(b *testing.B) *embedded.Store {
	s, err := embedded.Open(b.TempDir(), embedded.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func rawApply(b *testing.B, evs []contract.Event) time.Duration {
	b.Helper()
	s := open(b)
	defer s.Close()
	docs := make([]graph.Doc, len(evs))
	for i := range evs {
		docs[i] = graph.FromEvent(&evs[i])
	}
	start := time.Now()
	for i := 0; i < len(docs); i += 256 {
		if _, err := s.Apply(context.Background(), docs[i:min(i+256, len(docs))]); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func project(b *testing.B, evs []contract.Event) time.Duration {
	b.Helper()
	ctx := context.Background()
	s := open(b)
	defer s.Close()
	n := testenv.StartNATS(b)
	js, err := jetstream.New(n.Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: contract.DocsStream, Subjects: []string{contract.DocsSubjectPrefix + ">"}}); err != nil {
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
		b.Fatal("publishing took over a minute")
	}
	p, err := graph.New(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	r, err := projector.New(js, p, projector.Config{Name: "bench", StopWhenCaughtUp: true}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := r.Run(ctx); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	if v, ok, err := s.Document(ctx, evs[len(evs)-1].Key); err != nil || !ok || v.Version != 1 {
		b.Fatalf("after the run: %+v %v %v", v, ok, err)
	}
	return elapsed
}
