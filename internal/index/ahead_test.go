package index_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// countingEmbedder counts the texts it embeds.
type countingEmbedder struct {
	embed.Embedder
	mu    sync.Mutex
	texts int
}

func (c *countingEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	c.mu.Lock()
	c.texts += len(texts)
	c.mu.Unlock()
	return c.Embedder.Embed(ctx, texts)
}

func (c *countingEmbedder) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.texts
}

// With EmbedAhead, Prepare embeds the chunks of the events the store does
// not hold yet, and their Apply embeds nothing more and stores the same
// vectors it would have; events the store holds are not embedded ahead
// (a replay costs the embedder nothing), what a stopped runtime prepared
// is dropped when it is forgotten, and without EmbedAhead Prepare does
// nothing.
func TestPrepareEmbedsAheadForApply(t *testing.T) {
	ctx := context.Background()
	h, err := embed.NewHash(benchDim)
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields("ahead of the write the embedder works on the next batch")
	evs := corpus.UpsertedEvents(corpus.Sequential(20, corpus.Shape{Title: corpus.Fixed("t"), Body: corpus.FilledParagraphs(3, 600, words...)}))
	events := make([]*contract.Event, len(evs))
	for i := range evs {
		events[i] = &evs[i]
	}
	open := func(opts index.Options) (*index.Index, *countingEmbedder, *embedded.Store) {
		be, err := embedded.Open(t.TempDir(), embedded.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = be.Close() })
		e := &countingEmbedder{Embedder: h}
		x, err := index.New(ctx, be, e, opts)
		if err != nil {
			t.Fatal(err)
		}
		return x, e, be
	}

	unique := map[string]bool{}
	for _, ev := range events[:10] {
		for _, c := range ev.Chunks {
			unique[c.Hash] = true
		}
	}
	x, e, be := open(index.Options{EmbedAhead: true})
	x.Prepare(ctx, events[:10]) // returns at once; Apply waits for its vectors
	for _, r := range x.Apply(ctx, events[:10]) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	prepared := e.count()
	if prepared != len(unique) {
		t.Fatalf("Prepare then Apply embedded %d texts; want the %d distinct texts once (Apply asking for none again)", prepared, len(unique))
	}
	// The vectors are the ones Apply would have made.
	for _, ev := range events[:10] {
		pts, err := be.Points(ctx, ev.Key, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pts {
			want, _ := h.Embed(ctx, []string{p.Text})
			if !slices.Equal(p.Vector, want[0]) {
				t.Fatalf("%s chunk %d: the vector embedded ahead differs from the text's", ev.Key, p.Ordinal)
			}
		}
	}
	// Held already: a replay of them is not embedded ahead. (Prepare
	// starts its requests in the background: give them time to show.)
	x.Prepare(ctx, events[:10])
	time.Sleep(100 * time.Millisecond)
	if got := e.count(); got != prepared {
		t.Fatalf("Prepare of events the store holds embedded %d texts", got-prepared)
	}

	// Forgotten (the runtime that prepared stopped): Apply embeds what
	// Prepare had asked for again, as if nothing had been prepared.
	apply := func(x *index.Index) {
		for _, r := range x.Apply(ctx, events[10:]) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	alone, aloneE, _ := open(index.Options{EmbedAhead: true})
	apply(alone)
	ahead, aheadE, _ := open(index.Options{EmbedAhead: true})
	ahead.Prepare(ctx, events[10:])
	apply(ahead)
	forgot, forgotE, _ := open(index.Options{EmbedAhead: true})
	forgot.Prepare(ctx, events[10:])
	forgot.Forget(ctx)
	apply(forgot)
	deadline := time.Now().Add(5 * time.Second)
	for forgotE.count() != aheadE.count()+aloneE.count() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // Prepare's requests run in the background
	}
	if got, want := forgotE.count(), aheadE.count()+aloneE.count(); got != want {
		t.Fatalf("Prepare, Forget then Apply embedded %d texts; want what Prepare asked for (%d) and what Apply alone embeds (%d)", got, aheadE.count(), aloneE.count())
	}

	y, f, _ := open(index.Options{})
	y.Prepare(ctx, events)
	z, g, _ := open(index.Options{EmbedAhead: true, ReuseVectors: true})
	z.Prepare(ctx, events)
	time.Sleep(100 * time.Millisecond)
	if f.count() != 0 {
		t.Fatalf("without EmbedAhead, Prepare embedded %d texts", f.count())
	}
	if g.count() != 0 {
		t.Fatalf("with ReuseVectors, Prepare embedded %d texts (some would be reused)", g.count())
	}
}
