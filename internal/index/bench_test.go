package index_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/projector/projectortest"
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
		// The real Qdrant 1.16.3 server (scripts/qdrant-server.sh), a
		// fresh collection each time.
		{"qdrant-server", func(b *testing.B) index.Backend {
			srv := testenv.LeaseQdrant(b)
			q, err := qdrant.New(context.Background(), qdrant.Config{Addr: srv.URL, Collection: srv.Collection})
			if err != nil {
				b.Fatal(err)
			}
			return q
		}},
	}
}

// benchRounds is how many rounds of each side one iteration of
// BenchmarkProjector measures, alternating their order.
const benchRounds = 3

// BenchmarkProjector measures, in one run for each backend, the index
// projector end to end (events in a JetStream stream -> runtime -> decode
// and verify -> embedder -> backend, with markers, stale deletes and
// count fences) against the backend's raw upsert of the same points with
// their vectors computed beforehand (the limit), and reports the ratios.
// The projector runs twice a round: with an embedder that hands out the
// same precomputed vectors (so that embedding is not what is compared:
// the target's comparison), and with the hash embedder it runs with by
// default (embedding every chunk is then part of its work).
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
	pts := benchPoints(b, e, evs)
	pre := precomputed(pts, benchDim)
	for _, bb := range benchBackends() {
		b.Run(bb.name, func(b *testing.B) {
			js := projectortest.Prefill(b, evs)
			cmpPre := projectortest.Comparison{Name: bb.name + ", precomputed vectors", Unit: "points", N: float64(points)}
			cmpHash := projectortest.Comparison{Name: bb.name + ", hash embedder", Unit: "points", N: float64(points)}
			// The former baseline, without the durability points: beside
			// the new, so that both figures come from the same run.
			cmpUnsynced := projectortest.Comparison{Name: bb.name + ", precomputed vectors, against the raw write without durability points", Unit: "points", N: float64(points)}
			run := 0
			for range b.N {
				for round := range benchRounds {
					var raw, unsynced, withPre, withHash time.Duration
					sides := []func(){
						func() { raw = rawUpsert(b, bb.open(b), pts, true) },
						func() { unsynced = rawUpsert(b, bb.open(b), pts, false) },
						func() { withPre = project(b, js, &run, bb.open(b), pre, evs) },
						func() { withHash = project(b, js, &run, bb.open(b), e, evs) },
					}
					if round%2 == 1 {
						slices.Reverse(sides)
					}
					for _, side := range sides {
						side()
					}
					cmpPre.Add(projectortest.Round{Projector: withPre, Raw: raw})
					cmpHash.Add(projectortest.Round{Projector: withHash, Raw: raw})
					cmpUnsynced.Add(projectortest.Round{Projector: withPre, Raw: unsynced})
				}
			}
			cmpUnsynced.Log(b)
			cmpPre.Report(b, "")
			cmpHash.Report(b, "hash_")
			b.Logf("%s: %d documents, %d points, dim %d", bb.name, benchDocs, points, benchDim)
		})
	}
}

// benchPoints are the points of evs, with their vectors.
func benchPoints(b *testing.B, e embed.Embedder, evs []contract.Event) []index.Point {
	b.Helper()
	var pts []index.Point
	for _, ev := range evs {
		texts := make([]string, len(ev.Chunks))
		for i, c := range ev.Chunks {
			texts[i] = c.Text
		}
		vecs, err := e.Embed(context.Background(), texts)
		if err != nil {
			b.Fatal(err)
		}
		for i, c := range ev.Chunks {
			pts = append(pts, index.Point{ID: c.ID, Key: ev.Key, Version: ev.Version, Ordinal: c.Ordinal, ContentHash: ev.ContentHash,
				ChunkHash: c.Hash, Title: ev.Title, Tags: ev.Tags, Text: c.Text, Vector: vecs[i]})
		}
	}
	return pts
}

// precomputedEmbedder hands out vectors computed beforehand, by text.
type precomputedEmbedder struct {
	dim  int
	vecs map[string][]float32
}

func precomputed(pts []index.Point, dim int) *precomputedEmbedder {
	e := &precomputedEmbedder{dim: dim, vecs: make(map[string][]float32, len(pts))}
	for _, p := range pts {
		e.vecs[p.Text] = p.Vector
	}
	return e
}

func (e *precomputedEmbedder) Name() string   { return fmt.Sprintf("bench.precomputed/%d", e.dim) }
func (e *precomputedEmbedder) Dimension() int { return e.dim }
func (e *precomputedEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		v, ok := e.vecs[t]
		if !ok {
			return nil, fmt.Errorf("no precomputed vector for a text of %d bytes", len(t))
		}
		out[i] = v
	}
	return out, nil
}

// rawUpsert times Backend.Upsert of every point, in batches of 256. With
// durable, it also makes the points durable as often as the projector
// does, with the store's call that does it for the projector: a
// SetMarkers of their documents after every syncPoints points (the points
// of one shard's part of a batch: the runtime's 256 events over its 2
// shards, 4 points each), so that the ratio measures the projector and not
// the fsync the raw side skipped. (The embedded index's Upsert is made
// durable by the next SetMarkers; Qdrant's upsert waits for its own WAL.)
func rawUpsert(b *testing.B, be index.Backend, pts []index.Point, durable bool) time.Duration {
	b.Helper()
	defer be.Close()
	ctx := context.Background()
	if err := be.Ensure(ctx, benchDim); err != nil {
		b.Fatal(err)
	}
	const syncPoints = 512
	start := time.Now()
	synced := 0
	for i := 0; i < len(pts); i += 256 {
		end := min(i+256, len(pts))
		if err := be.Upsert(ctx, pts[i:end]); err != nil {
			b.Fatal(err)
		}
		if durable && (end-synced >= syncPoints || end == len(pts)) {
			if err := be.SetMarkers(ctx, markersOf(pts[synced:end])); err != nil {
				b.Fatal(err)
			}
			synced = end
		}
	}
	return time.Since(start)
}

// markersOf are the markers of the documents of pts.
func markersOf(pts []index.Point) []index.Marker {
	var out []index.Marker
	for i, p := range pts {
		if i == 0 || p.Key != pts[i-1].Key {
			out = append(out, index.Marker{Key: p.Key, Version: p.Version, ContentHash: p.ContentHash})
		}
	}
	return out
}

// project times the projector over the prefilled stream of js, with a
// consumer of its own (run numbers them), until it has caught up.
func project(b *testing.B, js jetstream.JetStream, run *int, be index.Backend, e embed.Embedder, evs []contract.Event) time.Duration {
	b.Helper()
	return projectWith(b, js, run, be, e, evs, index.Options{})
}

// projectWith is project with the index's options.
func projectWith(b *testing.B, js jetstream.JetStream, run *int, be index.Backend, e embed.Embedder, evs []contract.Event, opts index.Options) time.Duration {
	b.Helper()
	defer be.Close()
	ctx := context.Background()
	tb := &timedBackend{Backend: be}
	x, err := index.New(ctx, tb, e, opts)
	if err != nil {
		b.Fatal(err)
	}
	*run++
	elapsed := projectortest.Project(b, js, fmt.Sprintf("bench-%d", *run), x)
	if testing.Verbose() { // a benchmark's log keeps its first 10 lines: the figures come after the runs
		b.Logf("projector run %d (%s): %v, of which in store calls %s", *run, e.Name(), elapsed.Round(time.Millisecond), tb)
	}
	counts, err := be.Counts(ctx, []string{evs[0].Key, evs[len(evs)-1].Key})
	if err != nil || counts[evs[0].Key] != len(evs[0].Chunks) || counts[evs[len(evs)-1].Key] != len(evs[len(evs)-1].Chunks) {
		b.Fatalf("after the run: counts %v, %v", counts, err)
	}
	return elapsed
}

// timedBackend adds up the time an index spends in each of its store's
// calls: where a projector's time goes beside the upsert the raw side
// times alone.
type timedBackend struct {
	index.Backend
	mu    sync.Mutex
	spent [5]time.Duration // Markers, Upsert, DeleteStale, Counts, SetMarkers
}

func (t *timedBackend) add(i int, start time.Time) {
	t.mu.Lock()
	t.spent[i] += time.Since(start)
	t.mu.Unlock()
}

func (t *timedBackend) Markers(ctx context.Context, keys []string) (map[string]index.Marker, error) {
	defer t.add(0, time.Now())
	return t.Backend.Markers(ctx, keys)
}

func (t *timedBackend) Upsert(ctx context.Context, points []index.Point) error {
	defer t.add(1, time.Now())
	return t.Backend.Upsert(ctx, points)
}

func (t *timedBackend) DeleteStale(ctx context.Context, keep []index.Keep) error {
	defer t.add(2, time.Now())
	return t.Backend.DeleteStale(ctx, keep)
}

func (t *timedBackend) Counts(ctx context.Context, keys []string) (map[string]int, error) {
	defer t.add(3, time.Now())
	return t.Backend.Counts(ctx, keys)
}

func (t *timedBackend) SetMarkers(ctx context.Context, markers []index.Marker) error {
	defer t.add(4, time.Now())
	return t.Backend.SetMarkers(ctx, markers)
}

func (t *timedBackend) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var sum time.Duration
	for _, d := range t.spent {
		sum += d
	}
	return fmt.Sprintf("%v (markers %v, upsert %v, delete stale %v, count fence %v, set markers %v; summed over the shards, which run in parallel)",
		sum.Round(time.Millisecond), t.spent[0].Round(time.Millisecond), t.spent[1].Round(time.Millisecond),
		t.spent[2].Round(time.Millisecond), t.spent[3].Round(time.Millisecond), t.spent[4].Round(time.Millisecond))
}
