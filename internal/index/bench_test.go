package index_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	benchDocs = 2000
	benchDim  = 256
)

// benchEvents are benchDocs documents of about 4 KB, four 1 KB chunks each.
func benchEvents(b *testing.B) []contract.Event {
	b.Helper()
	words := strings.Fields("the quick brown fox jumps over a lazy dog while projectors converge every store to postgres")
	return corpus.UpsertedEvents(corpus.Sequential(benchDocs, corpus.Shape{
		Title: corpus.Fixed("bench"), Body: corpus.FilledParagraphs(4, 1000, words...), Tags: corpus.Fixed([]string{"bench"})}))
}

type benchBackend struct {
	name string
	open func(b *testing.B) index.Backend
}

func benchBackends() []benchBackend {
	return []benchBackend{
		{"embedded", func(b *testing.B) index.Backend {
			s, err := embedded.Open(b.TempDir(), embedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"qdrant-grpc", func(b *testing.B) index.Backend {
			srv := qdranttest.Start(b)
			q, err := qdrant.New(context.Background(), qdrant.Config{Addr: srv.Addr(), Collection: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			return q
		}},
	}
}

// BenchmarkProjector measures, in one run for each backend, the index
// projector end to end (events in a JetStream stream -> runtime -> hash
// embedder -> backend, with markers, stale deletes and count fences) and
// the backend's raw upsert rate of the same points with precomputed
// vectors (the limit), and reports the ratio.
func BenchmarkProjector(b *testing.B) {
	evs := benchEvents(b)
	points := 0
	for _, ev := range evs {
		points += len(ev.Chunks)
	}
	e, err := embed.NewHash(benchDim)
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range benchBackends() {
		b.Run(bb.name, func(b *testing.B) {
			var rawTime, projTime time.Duration
			for range b.N {
				rawTime += rawUpsert(b, bb.open(b), e, evs)
				projTime += project(b, bb.open(b), e, evs)
			}
			n := float64(b.N)
			raw := float64(points) * n / rawTime.Seconds()
			proj := float64(points) * n / projTime.Seconds()
			b.ReportMetric(float64(benchDocs)*n/projTime.Seconds(), "docs/s")
			b.ReportMetric(proj, "points/s")
			b.ReportMetric(raw, "raw_points/s")
			b.ReportMetric(proj/raw, "ratio")
			b.Logf("%s: projector %.0f docs/s, %.0f points/s; raw upsert %.0f points/s; ratio %.2f (%d documents, %d points, dim %d)",
				bb.name, float64(benchDocs)*n/projTime.Seconds(), proj, raw, proj/raw, benchDocs, points, benchDim)
		})
	}
}

// rawUpsert times Backend.Upsert of every point, vectors computed before
// the clock starts, in batches of 256.
func rawUpsert(b *testing.B, be index.Backend, e embed.Embedder, evs []contract.Event) time.Duration {
	b.Helper()
	defer be.Close()
	ctx := context.Background()
	if err := be.Ensure(ctx, e.Dimension()); err != nil {
		b.Fatal(err)
	}
	var pts []index.Point
	for _, ev := range evs {
		texts := make([]string, len(ev.Chunks))
		for i, c := range ev.Chunks {
			texts[i] = c.Text
		}
		vecs, err := e.Embed(ctx, texts)
		if err != nil {
			b.Fatal(err)
		}
		for i, c := range ev.Chunks {
			pts = append(pts, index.Point{ID: c.ID, Key: ev.Key, Version: ev.Version, Ordinal: c.Ordinal, ContentHash: ev.ContentHash,
				ChunkHash: c.Hash, Title: ev.Title, Tags: ev.Tags, Text: c.Text, Vector: vecs[i]})
		}
	}
	start := time.Now()
	for i := 0; i < len(pts); i += 256 {
		if err := be.Upsert(ctx, pts[i:min(i+256, len(pts))]); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// project times the projector from a stream holding every event until it
// has caught up.
func project(b *testing.B, be index.Backend, e embed.Embedder, evs []contract.Event) time.Duration {
	b.Helper()
	defer be.Close()
	ctx := context.Background()
	n := testenv.StartNATS(b)
	nc := n.Connect(b)
	js, err := jetstream.New(nc)
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
		b.Fatal("publishing the events took over a minute")
	}
	x, err := index.New(ctx, be, e, index.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := projector.New(js, x, projector.Config{Name: "bench", StopWhenCaughtUp: true}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := r.Run(ctx); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	counts, err := be.Counts(ctx, []string{evs[0].Key, evs[len(evs)-1].Key})
	if err != nil || counts[evs[0].Key] != len(evs[0].Chunks) {
		b.Fatalf("after the run: counts %v, %v", counts, err)
	}
	return elapsed
}
