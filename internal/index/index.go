// Package index is the index projection: one point per chunk of the current
// version of every document, in a [Backend] (a Qdrant collection, or the
// embedded index; an [Index] needs only its [ReadWriter] side), converged to the stream's events by the projector
// runtime.
//
// Model: a point's id is the chunk's derived id (contract.ChunkID of key,
// version and ordinal), its vector the embedding of the chunk's text, its
// payload the document key, version, ordinal, content hash, chunk hash,
// title, tags and text. Each document also has a version marker in the
// same store, so the freshness guard survives restarts and rebuilds.
//
// Write order for an upserted version V of document K (the marker last, so
// a crash anywhere before it leaves the marker behind and a redelivery
// redoes the whole write, idempotently):
//
//  1. if K's marker holds a version newer than V, or V itself and the
//     call is not a repair (see projector.WithRepair): skip; when it holds
//     a newer version, K's points older than it are deleted on the way
//     (see "A writer that lost its lease" below);
//  2. upsert the points of V (vectors of chunks whose text is unchanged are
//     reused when ReuseVectors is set, instead of embedding them again,
//     except in a repair);
//  3. delete K's points of every version older than V (a version with
//     fewer chunks leaves none behind); never a newer version's;
//  4. count fence: K must now have exactly len(chunks) points of V or
//     older versions (points of a newer version, which a writer stopped
//     before their marker left, are their own event's to settle: it is
//     still due);
//  5. read K's marker again: if it now holds a version newer than V,
//     another writer has superseded V while this one wrote, and V's points
//     are retracted (deleted by their version) and the event is skipped;
//     otherwise a count fence that failed is an error naming both numbers
//     (and is retried);
//  6. set K's marker to V (a conditional write: a stored marker of V or a
//     newer version is left as it is).
//
// A withdrawal (version V) deletes K's points older than V, checks that
// none is left, and sets a deleted marker at V, which a late older upsert
// cannot get past.
//
// A repair (a re-emitted event, applied in a call whose context is marked
// by projector.WithRepair) of the version K's marker holds goes through
// steps 2 to 6 again: the version's points are rewritten whole and those of
// older versions deleted, which restores points lost or altered behind
// the projector's back. The marker is left as it is (it already holds V).
//
// A writer that lost its lease. Two writers can overlap for a moment: one
// paused (or cut off from NATS) mid-call resumes after another took over
// and applied a newer version. Every write of the late one is bounded by
// its own version: its delete (step 3) removes only older versions, its
// marker write (step 6) cannot go back, and whatever points of its version
// it wrote are removed again, by it (step 5) or by the newer writer's
// delete of older versions (step 3). So once both calls are done the
// store holds the newer version alone, whatever the interleaving. One
// window remains: the late writer killed between its point write and its
// marker read, after the newer writer's delete; its points then stay,
// beside the newer version's, until the next event for K (a redelivery of
// the late event included, by step 1) or a repair deletes them. verify
// names such a document (its chunks disagree with Postgres).
package index

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Index applies events to a store.
type Index struct {
	backend  ReadWriter
	embedder embed.Embedder
	reuse    bool
	ahead    bool

	// aheadMu guards the vectors Prepare asked for, by chunk hash: the
	// latest Prepare's and the one's before it, so that what no Apply
	// took is dropped after two batches.
	aheadMu sync.Mutex
	lanes   map[string]*aheadLane // by runtime (projector.RuntimeName)

	// identity is the configured embedder's. mismatch is set when the
	// store records another embedder's vectors: the index then refuses
	// every write. reader embeds search queries as the store's vectors
	// were (the configured embedder, or ReadEmbedder's for the stored
	// identity); searchErr, when no embedder can, is every search's error.
	identity  embed.Identity
	mismatch  *EmbedderMismatchError
	reader    embed.Embedder
	searchErr error
}

// Options of an Index.
type Options struct {
	// ReuseVectors looks up the stored vectors of a document's previous
	// version and reuses those of unchanged chunks instead of embedding
	// them again: worth a read when embedding is remote and costly.
	ReuseVectors bool
	// EmbedAhead embeds the chunks of the next batch while the runtime
	// applies the current one ([Index.Prepare]), so that a remote
	// embedder is not idle while the store is written. Without
	// ReuseVectors only (which would reuse some of those vectors).
	EmbedAhead bool
	// ReadEmbedder, when set, returns an embedder for the identity
	// recorded in a store whose vectors another embedder than the
	// configured one made, so that its searches are still answered (with
	// queries embedded as its vectors were) until a rebuild replaces it.
	ReadEmbedder func(embed.Identity) (embed.Embedder, error)
}

// EmbedderMismatchError is the error of every write to a store whose
// vectors another embedder made than the one configured: vectors of two
// models are never mixed in one store. A rebuild re-embeds the documents
// into a fresh generation with the configured embedder and makes it live.
// It is not [projector.Permanent]: the projector retries the writes in
// place, acknowledging nothing, until the rebuild has switched.
type EmbedderMismatchError struct {
	Stored     embed.Identity // the embedder recorded with the store
	Configured embed.Identity // the projector's
}

func (e *EmbedderMismatchError) Error() string {
	return fmt.Sprintf("index: the store's vectors were made by the embedder %s, not by the configured %s; "+
		"writes are refused so that two models' vectors are never mixed: run `converge rebuild index` "+
		"to re-embed every document into a fresh generation, which becomes live when it is done "+
		"(or configure the embedder the store was made with)", e.Stored, e.Configured)
}

// New returns an index over backend for the embedder's vectors, ensuring
// the store for the embedder's dimension and recording the embedder's
// identity in it when it has none (a new store, or one made before
// identities were recorded, whose vectors are taken for the configured
// embedder's).
//
// A store that records another embedder is neither prepared nor written:
// the index is returned refusing every write with an
// [*EmbedderMismatchError] (see [Index.Embedder]), and answers searches
// with Options.ReadEmbedder's embedder for the recorded identity, if any.
func New(ctx context.Context, backend ReadWriter, embedder embed.Embedder, opts Options) (*Index, error) {
	want := embed.IdentityOf(embedder)
	have, recorded, err := backend.Embedder(ctx)
	if err != nil {
		return nil, fmt.Errorf("index: read the store's embedder: %w", err)
	}
	x := &Index{backend: backend, embedder: embedder, reuse: opts.ReuseVectors, ahead: opts.EmbedAhead && !opts.ReuseVectors,
		identity: want, reader: embedder}
	if recorded && have != want {
		x.mismatch = &EmbedderMismatchError{Stored: have, Configured: want}
		x.reader, err = nil, errors.New("no embedder for the store's vectors is available")
		if opts.ReadEmbedder != nil {
			x.reader, err = opts.ReadEmbedder(have)
		}
		if err != nil {
			x.reader = nil
			x.searchErr = fmt.Errorf("index: cannot embed a query as the store's vectors were (%s): %w; %w", have, err, x.mismatch)
		}
		return x, nil
	}
	if err := backend.Ensure(ctx, embedder.Dimension()); err != nil {
		return nil, fmt.Errorf("index: %w", err)
	}
	if !recorded {
		if err := backend.RecordEmbedder(ctx, want); err != nil {
			return nil, fmt.Errorf("index: %w", err)
		}
	}
	return x, nil
}

// Embedder reports the embedder whose vectors the store holds, the
// configured one, and, when they differ, the error every write fails
// with.
func (x *Index) Embedder() (stored, configured embed.Identity, refusing error) {
	if x.mismatch != nil {
		return x.mismatch.Stored, x.mismatch.Configured, x.mismatch
	}
	return x.identity, x.identity, nil
}

// ReadEmbedder is the embedder of the store's vectors: the configured
// one, or the one ReadEmbedder found for the stored identity; nil when
// there is none.
func (x *Index) ReadEmbedder() embed.Embedder { return x.reader }

// Backend is the store under the index, as New was given it.
func (x *Index) Backend() ReadWriter { return x.backend }

// Apply implements projector.Store. Events must have distinct keys. The
// backend is written in batches across the events; if a batch fails
// permanently, the events are applied one by one so that only the one the
// store rejects fails.
func (x *Index) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	if x.mismatch != nil {
		results := make([]projector.Result, len(events))
		for i := range results {
			results[i].Err = x.mismatch
		}
		return results
	}
	results, err := x.apply(ctx, events)
	if err == nil {
		return results
	}
	results = make([]projector.Result, len(events))
	if !projector.IsPermanent(err) || len(events) == 1 {
		for i := range results {
			results[i].Err = err
		}
		return results
	}
	for i, ev := range events {
		one, err := x.apply(ctx, []*contract.Event{ev})
		if err != nil {
			results[i].Err = err
		} else {
			results[i] = one[0]
		}
	}
	return results
}

// Prepare implements projector.Preparer: with EmbedAhead, it starts
// embedding the chunks of the events the store does not hold yet (by
// their version markers) and returns at once; the Apply of the same
// events waits for those vectors instead of asking for them again. So the
// embedder has the next batch's requests queued while the runtime writes
// the current one, and is never idle between batches. It changes nothing
// in the store; a failure only leaves Apply to embed the texts itself.
func (x *Index) Prepare(ctx context.Context, events []*contract.Event) {
	if !x.ahead || x.mismatch != nil {
		return
	}
	markers, err := x.backend.Markers(ctx, keysOf(events))
	if err != nil {
		return
	}
	next := map[string]*aheadVector{}
	var texts []string
	var pending []*aheadVector
	x.aheadMu.Lock()
	for _, ev := range events {
		if m, ok := markers[ev.Key]; ev.Kind != contract.KindUpserted || ok && m.Version >= ev.Version {
			continue
		}
		for _, c := range ev.Chunks {
			if _, ok := next[c.Hash]; ok {
				continue
			}
			if v := x.aheadLocked(ctx, c.Hash); v != nil {
				next[c.Hash] = v // asked for by the Prepare before: shared
				continue
			}
			v := &aheadVector{done: make(chan struct{})}
			next[c.Hash] = v
			texts, pending = append(texts, c.Text), append(pending, v)
		}
	}
	lane := x.laneLocked(ctx)
	lane.prev, lane.cur = lane.cur, next
	x.aheadMu.Unlock()
	if len(texts) == 0 {
		return
	}
	go func() {
		vecs, err := x.embedder.Embed(ctx, texts)
		ok := err == nil && len(vecs) == len(texts)
		for i, v := range pending {
			if ok {
				v.vec = vecs[i]
			}
			close(v.done)
		}
	}()
}

// aheadVector is a vector Prepare asked for: vec is set (or left nil, on
// a failure) before done is closed.
type aheadVector struct {
	done chan struct{}
	vec  []float32
}

// aheadLane is what the two latest Prepares of one runtime asked for.
type aheadLane struct {
	cur, prev map[string]*aheadVector
}

// Forget drops what Prepare asked for on behalf of ctx's runtime, which
// stopped (projector.Forgetter).
func (x *Index) Forget(ctx context.Context) {
	x.aheadMu.Lock()
	defer x.aheadMu.Unlock()
	delete(x.lanes, projector.RuntimeName(ctx))
}

// laneLocked is the lane of ctx's runtime: the runtimes of a partitioned
// projector each prepare their own next batch.
func (x *Index) laneLocked(ctx context.Context) *aheadLane {
	name := projector.RuntimeName(ctx)
	l := x.lanes[name]
	if l == nil {
		if x.lanes == nil {
			x.lanes = map[string]*aheadLane{}
		}
		l = &aheadLane{}
		x.lanes[name] = l
	}
	return l
}

func (x *Index) aheadLocked(ctx context.Context, h string) *aheadVector {
	l := x.laneLocked(ctx)
	if v, ok := l.cur[h]; ok {
		return v
	}
	return l.prev[h]
}

// takeAhead returns the vector Prepare asked for a chunk of hash h (a
// text), waiting for it, or nil when Prepare did not ask for it or could
// not get it. Chunks of equal text share it; what the two latest Prepares
// of ctx's runtime asked for is kept, the rest dropped.
func (x *Index) takeAhead(ctx context.Context, h string) []float32 {
	x.aheadMu.Lock()
	v := x.aheadLocked(ctx, h)
	x.aheadMu.Unlock()
	if v == nil {
		return nil
	}
	select {
	case <-v.done:
		return v.vec
	case <-ctx.Done():
		return nil
	}
}

// apply returns per-event results, or one error for all of them.
func (x *Index) apply(ctx context.Context, events []*contract.Event) ([]projector.Result, error) {
	results := make([]projector.Result, len(events))
	keys := make([]string, len(events))
	for i, ev := range events {
		keys[i] = ev.Key
	}
	markers, err := x.backend.Markers(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("index: read version markers: %w", err)
	}
	repair := projector.IsRepair(ctx)
	var todo []*contract.Event
	var todoIdx []int
	var superseded []Keep
	for i, ev := range events {
		if m, ok := markers[ev.Key]; ok && (m.Version > ev.Version || (m.Version == ev.Version && !repair)) {
			results[i].Outcome = projector.Skipped
			if m.Version > ev.Version {
				superseded = append(superseded, Keep{Key: ev.Key, Version: m.Version})
			}
			continue
		}
		todo = append(todo, ev)
		todoIdx = append(todoIdx, i)
	}
	// An event older than the marker may be the one a writer that lost
	// its lease was writing when it stopped: what it left of its points
	// is deleted with every other version older than the marker's.
	if len(superseded) > 0 {
		if err := x.backend.DeleteStale(ctx, superseded); err != nil {
			return nil, fmt.Errorf("index: delete points older than the version markers: %w", err)
		}
	}
	if len(todo) == 0 {
		return results, nil
	}

	// A repair embeds its chunks again rather than trust the stored
	// vectors it is repairing.
	points, err := x.points(ctx, todo, markers, x.reuse && !repair)
	if err != nil {
		return nil, err
	}
	if len(points) > 0 {
		if err := x.backend.Upsert(ctx, points); err != nil {
			return nil, fmt.Errorf("index: upsert %d points: %w", len(points), err)
		}
	}
	keep := make([]Keep, len(todo))
	for i, ev := range todo {
		keep[i] = Keep{Key: ev.Key, Version: ev.Version}
		if ev.Kind == contract.KindWithdrawn && ev.Version < math.MaxInt64 {
			// A withdrawal keeps no point of its own version either
			// (a repair of it removes strays).
			keep[i].Version++
		}
	}
	if err := x.backend.DeleteStale(ctx, keep); err != nil {
		return nil, fmt.Errorf("index: delete stale points: %w", err)
	}

	// Count fence: a partial write is an error, never agreement.
	todoKeys := keysOf(todo)
	counts, err := x.backend.Counts(ctx, todoKeys)
	if err != nil {
		return nil, fmt.Errorf("index: count fence: %w", err)
	}
	// The markers again, after the writes: a newer version set meanwhile
	// means another writer superseded these events while they were
	// written.
	now, err := x.backend.Markers(ctx, todoKeys)
	if err != nil {
		return nil, fmt.Errorf("index: read version markers after writing: %w", err)
	}
	var retract []Keep
	var newMarkers []Marker
	for j, ev := range todo {
		if m, ok := now[ev.Key]; ok && m.Version > ev.Version {
			if ev.Kind == contract.KindUpserted {
				retract = append(retract, Keep{Key: ev.Key, Version: ev.Version})
			}
			results[todoIdx[j]] = projector.Result{Outcome: projector.Skipped}
			continue
		}
		want := 0
		if ev.Kind == contract.KindUpserted {
			want = len(ev.Chunks)
		}
		if got := counts[ev.Key]; got != want {
			// Points of a newer version may be there too: written by a
			// writer that stopped before their marker, their event still
			// due. They are that event's to settle, not this one's.
			upTo, err := x.countUpTo(ctx, ev.Key, ev.Version)
			if err != nil {
				return nil, fmt.Errorf("index: count fence: %w", err)
			}
			if upTo != want {
				results[todoIdx[j]].Err = fmt.Errorf("index: count fence: %q holds %d points of version %d or older after writing version %d, want %d",
					ev.Key, upTo, ev.Version, ev.Version, want)
				continue
			}
		}
		newMarkers = append(newMarkers, Marker{Key: ev.Key, Version: ev.Version, Deleted: ev.Kind == contract.KindWithdrawn, ContentHash: ev.ContentHash})
	}
	if len(retract) > 0 {
		if err := x.backend.Retract(ctx, retract); err != nil {
			return nil, fmt.Errorf("index: retract the points of superseded versions: %w", err)
		}
	}
	if len(newMarkers) > 0 {
		if err := x.backend.SetMarkers(ctx, newMarkers); err != nil {
			return nil, fmt.Errorf("index: set version markers: %w", err)
		}
	}
	return results, nil
}

// countUpTo counts key's points of version at most v.
func (x *Index) countUpTo(ctx context.Context, key string, v int64) (int, error) {
	pts, err := x.backend.Points(ctx, key, false)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pts {
		if p.Version <= v {
			n++
		}
	}
	return n, nil
}

// points builds the points of the upserted events, embedding the chunks
// (or reusing the vectors of unchanged ones).
func (x *Index) points(ctx context.Context, events []*contract.Event, markers map[string]Marker, reuse bool) ([]Point, error) {
	var points []Point
	for _, ev := range events {
		if ev.Kind != contract.KindUpserted {
			continue
		}
		for _, c := range ev.Chunks {
			points = append(points, Point{ID: c.ID, Key: ev.Key, Version: ev.Version, Ordinal: c.Ordinal,
				ContentHash: ev.ContentHash, ChunkHash: c.Hash, Title: ev.Title, Tags: ev.Tags, Text: c.Text})
		}
	}
	if len(points) == 0 {
		return nil, nil
	}
	if reuse {
		for _, ev := range events {
			if _, seen := markers[ev.Key]; !seen || ev.Kind != contract.KindUpserted {
				continue
			}
			old, err := x.backend.Points(ctx, ev.Key, true)
			if err != nil {
				return nil, fmt.Errorf("index: read vectors of %q: %w", ev.Key, err)
			}
			byHash := make(map[string][]float32, len(old))
			for _, p := range old {
				if len(p.Vector) == x.embedder.Dimension() {
					byHash[p.ChunkHash] = p.Vector
				}
			}
			for i := range points {
				if points[i].Key == ev.Key && points[i].Vector == nil {
					points[i].Vector = byHash[points[i].ChunkHash]
				}
			}
		}
	}
	if x.ahead {
		for i := range points {
			if points[i].Vector == nil {
				points[i].Vector = x.takeAhead(ctx, points[i].ChunkHash)
			}
		}
	}
	var texts []string
	var idx []int
	for i, p := range points {
		if p.Vector == nil {
			texts = append(texts, p.Text)
			idx = append(idx, i)
		}
	}
	if len(texts) > 0 {
		vecs, err := x.embedder.Embed(ctx, texts)
		if err != nil {
			return nil, fmt.Errorf("index: embed %d chunks with %s: %w", len(texts), x.embedder.Name(), err)
		}
		if len(vecs) != len(texts) {
			return nil, fmt.Errorf("index: embedder %s returned %d vectors for %d texts", x.embedder.Name(), len(vecs), len(texts))
		}
		for j, i := range idx {
			points[i].Vector = vecs[j]
		}
	}
	return points, nil
}

// SearchError is the error of every search when none can be answered: the
// store's vectors were made by another embedder, and none for them is
// available.
func (x *Index) SearchError() error { return x.searchErr }

// Search returns the k chunks nearest to the text, embedded as the
// store's vectors were.
func (x *Index) Search(ctx context.Context, text string, k int) ([]Hit, error) {
	if err := x.SearchError(); err != nil {
		return nil, err
	}
	vecs, err := x.reader.Embed(ctx, []string{text})
	if err != nil {
		return nil, fmt.Errorf("index: embed query with %s: %w", x.reader.Name(), err)
	}
	return x.backend.Search(ctx, vecs[0], k)
}

func keysOf(events []*contract.Event) []string {
	keys := make([]string, len(events))
	for i, ev := range events {
		keys[i] = ev.Key
	}
	return keys
}
