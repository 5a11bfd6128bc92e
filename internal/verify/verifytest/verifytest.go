// Package verifytest holds verify sides for tests: a store in memory that
// a test changes while verify reads it (a projector applying a repair, say).
package verifytest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
)

// Side is a verify side in memory, safe to change while it is read.
type Side struct {
	label string
	mu    sync.Mutex
	docs  map[string]verify.Doc
}

// NewSide is a side called label holding docs (by key; copied).
func NewSide(label string, docs map[string]verify.Doc) *Side {
	s := &Side{label: label, docs: make(map[string]verify.Doc, len(docs))}
	for k, d := range docs {
		s.docs[k] = d
	}
	return s
}

// Put stores d under its key, as a projector applying it would.
func (s *Side) Put(docs ...verify.Doc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range docs {
		s.docs[d.Key] = d
	}
}

// Memory is a snapshot of the side.
func (s *Side) Memory() *verify.Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &verify.Memory{Label: s.label}
	for _, d := range s.docs {
		m.Docs = append(m.Docs, d)
	}
	return m
}

// Name is the side's label.
func (s *Side) Name() string { return s.label }

// Digests are those of the side's current documents.
func (s *Side) Digests(ctx context.Context, kind verify.Kind, n int) ([]verify.BucketDigest, error) {
	return s.Memory().Digests(ctx, kind, n)
}

// Buckets are those of the side's current documents.
func (s *Side) Buckets(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, error) {
	return s.Memory().Buckets(ctx, kind, n, buckets)
}

// Doc is a document as verify reads it: key at version with content hash
// hash, chunks chunks of that hash (ids derived from the key), and links.
func Doc(key string, version int64, hash string, chunks int, links ...string) verify.Doc {
	d := verify.Doc{Key: key, Version: version, ContentHash: hash, Links: links}
	for i := range chunks {
		d.Chunks = append(d.Chunks, verify.Chunk{ID: uuid.NewSHA1(uuid.NameSpaceURL, []byte(key+string(rune('0'+i)))), Hash: hash})
	}
	return d
}

// Reemitter re-emits from Truth as the writer does (verify.Reemitter);
// with Repairs, it then copies each re-emitted document into Stores a
// little later, as the projectors would, except where Repairs says a store
// keeps its own. Err, when set, is returned after answering, as a writer
// failing on a later page.
type Reemitter struct {
	Truth   map[string]verify.Doc
	Stores  []*Side
	Repairs func(store, key string) bool
	Err     error

	mu    sync.Mutex
	asked []string
}

// ReemitKeys answers a re-emission of keys.
func (r *Reemitter) ReemitKeys(_ context.Context, keys []string) (writer.ReemitResponse, error) {
	r.mu.Lock()
	r.asked = append(r.asked, keys...)
	r.mu.Unlock()
	resp := writer.ReemitResponse{Reemitted: []writer.ReemittedDocument{}, NotFound: []string{}}
	for i, k := range keys {
		d, ok := r.Truth[k]
		if !ok {
			resp.NotFound = append(resp.NotFound, k)
			continue
		}
		resp.Reemitted = append(resp.Reemitted, writer.ReemittedDocument{Key: k, Version: d.Version, Emission: int64(i + 1)})
	}
	if r.Repairs != nil {
		time.AfterFunc(50*time.Millisecond, func() {
			for _, s := range r.Stores {
				for _, k := range keys {
					if d, ok := r.Truth[k]; ok && r.Repairs(s.Name(), k) {
						s.Put(d)
					}
				}
			}
		})
	}
	return resp, r.Err
}

// Asked are the keys asked for so far, sorted.
func (r *Reemitter) Asked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(slices.Values(r.asked))
}

// EveryDifference is a truth and an index and a graph that differ from it
// in every way verify names: a (stale_version), b (stale_chunks), c
// (content_mismatch in the index, links_mismatch in the graph), d
// (version_mismatch), x (extra) and e (missing from the index).
func EveryDifference() (truth map[string]verify.Doc, index, graph *Side) {
	truth = map[string]verify.Doc{}
	for _, d := range []verify.Doc{Doc("a", 2, "ha2", 2), Doc("b", 1, "hb", 3), Doc("c", 1, "hc", 1, "a"), Doc("d", 4, "hd", 1), Doc("e", 1, "he", 1)} {
		truth[d.Key] = d
	}
	index = NewSide("index", map[string]verify.Doc{
		"a": Doc("a", 1, "ha1", 2),                                                   // stale_version
		"b": Doc("b", 1, "hb", 1),                                                    // stale_chunks
		"c": {Key: "c", Version: 1, ContentHash: "other", Chunks: truth["c"].Chunks}, // content_mismatch: the index's marker
		"d": Doc("d", 5, "hd5", 1),                                                   // version_mismatch
		"x": Doc("x", 1, "hx", 1),                                                    // extra
		// e is missing.
	})
	graph = NewSide("graph", map[string]verify.Doc{
		"a": truth["a"], "b": truth["b"], "d": truth["d"], "e": truth["e"],
		"c": {Key: "c", Version: 1, ContentHash: "hc", Chunks: truth["c"].Chunks}, // links_mismatch
	})
	return truth, index, graph
}
