package embedded

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/storage/wal"
)

// Store is the embedded graph: a [graph.Backend] kept in memory and in an
// append-only log under one directory. See the package documentation for
// the files and the order of writes.
type Store struct {
	log *wal.Log

	mu sync.RWMutex
	// Nodes are never modified once stored (a write stores a new one), so
	// a compaction can write a copied slice of them without holding mu.
	nodes map[string]*node
	// linkedBy holds the incoming links of every key that has any: the
	// keys of the nodes linking to it, sorted. It is derived from the
	// nodes' links and not stored.
	linkedBy map[string][]string
}

// node is what the graph holds about one key apart from its incoming
// links: a written document (or its tombstone), or a stub.
type node struct {
	key                string
	stub               bool
	deleted            bool
	version            int64
	title, contentHash string
	chunks             []graph.Chunk // by ordinal, distinct IDs
	links, tags        []string      // sorted, distinct
}

// Open opens the embedded graph in dir, creating the directory if needed,
// and replays its snapshot and logs. It fails with [ErrLocked] if another
// Store has dir open, and with a [*CorruptError] if a file is damaged
// other than by a torn final record, which is truncated away.
func Open(dir string, opts Options) (*Store, error) {
	s := &Store{nodes: make(map[string]*node), linkedBy: make(map[string][]string)}
	log, err := wal.Open(dir, graphFormat, &durable{s: s}, opts)
	if err != nil {
		return nil, fmt.Errorf("embedded graph: %w", err)
	}
	s.log = log
	return s, nil
}

// Ensure has nothing to create: the store's keys are unique by
// construction. It reports a closed store, or one whose log failed.
func (s *Store) Ensure(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.log.Writable()
}

// Apply writes docs with the freshness guard; see [graph.Backend]. The
// documents that pass the guard are one log record, so after a crash
// either all of them are in the graph or none is. A call none of whose
// documents passes still returns only once what earlier calls appended is
// durable, since its answer may rest on their records.
func (s *Store) Apply(ctx context.Context, docs []graph.Doc) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Everything that does not depend on the stored state runs before the
	// lock: validation, the nodes to store, the count fence.
	incoming := make([]*node, len(docs))
	repair := make([]bool, len(docs))
	seen := make(map[string]struct{}, len(docs))
	for i := range docs {
		d := &docs[i]
		if _, dup := seen[d.Key]; dup {
			return nil, fmt.Errorf("%w: key %q appears twice in one call", ErrInvalidDocs, d.Key)
		}
		seen[d.Key] = struct{}{}
		n, err := newNode(d)
		if err != nil {
			return nil, err
		}
		incoming[i], repair[i] = n, d.Repair
	}
	applied := make([]bool, len(docs))
	err := s.log.Write(&s.mu, func() ([]byte, func(), error) {
		var fresh []*node
		for i, n := range incoming {
			if cur := s.nodes[n.key]; cur == nil || cur.stub || cur.version < n.version || (repair[i] && cur.version == n.version) {
				applied[i] = true
				fresh = append(fresh, n)
			}
		}
		if len(fresh) == 0 {
			return nil, nil, nil
		}
		rec, err := encodeNodes(opApply, fresh)
		return rec, func() {
			for _, n := range fresh {
				s.put(n)
			}
		}, err
	}, true)
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// newNode is the node d is stored as: its links and tags sorted and
// distinct, its chunks by ordinal with distinct IDs. The count fence
// compares it with d: a document that repeats a chunk ID, a link or a tag
// would be stored with fewer than it has.
func newNode(d *graph.Doc) (*node, error) {
	invalid := func(reason string) error {
		return fmt.Errorf("%w: document %q version %d: %s", ErrInvalidDocs, d.Key, d.Version, reason)
	}
	if d.Key == "" {
		return nil, invalid("empty key")
	}
	if d.Deleted && len(d.Chunks)+len(d.Links)+len(d.Tags) != 0 {
		return nil, invalid("a withdrawal with chunks, links or tags")
	}
	n := packNode(&node{key: d.Key, deleted: d.Deleted, version: d.Version, title: d.Title, contentHash: d.ContentHash,
		chunks: distinctChunks(d.Chunks), links: sortedSet(d.Links), tags: sortedSet(d.Tags)})
	if len(n.links) > 0 && n.links[0] == "" {
		return nil, invalid("a link to an empty key")
	}
	if len(n.chunks) != len(d.Chunks) || len(n.links) != len(d.Links) || len(n.tags) != len(d.Tags) {
		return nil, &FenceError{Key: d.Key, Version: d.Version,
			Stored:   [3]int{len(n.chunks), len(n.links), len(n.tags)},
			Incoming: [3]int{len(d.Chunks), len(d.Links), len(d.Tags)}}
	}
	return n, nil
}

func sortedSet(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	if !slices.IsSorted(out) {
		slices.Sort(out)
	}
	return slices.Compact(out)
}

func byOrdinal(a, b graph.Chunk) int { return cmp.Compare(a.Ordinal, b.Ordinal) }

// distinctChunks returns the chunks by ordinal, keeping the first of those
// that share an ID, as a uniqueness constraint on Chunk.id would.
func distinctChunks(in []graph.Chunk) []graph.Chunk {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	if !slices.IsSortedFunc(out, byOrdinal) {
		slices.SortStableFunc(out, byOrdinal)
	}
	kept := 0
	if len(out) <= 32 {
		// A document has a few chunks: comparing them pairwise costs less
		// than a set.
		for _, c := range out {
			if !slices.ContainsFunc(out[:kept], func(k graph.Chunk) bool { return k.ID == c.ID }) {
				out[kept] = c
				kept++
			}
		}
		return out[:kept]
	}
	seen := make(map[uuid.UUID]struct{}, len(out))
	for _, c := range out {
		if _, dup := seen[c.ID]; !dup {
			seen[c.ID] = struct{}{}
			out[kept] = c
			kept++
		}
	}
	return out[:kept]
}

// put stores n in place of the node of its key, moving the incoming links
// of the keys it stops or starts linking to, and creates a stub for every
// link target not seen yet; mu is held (or Open is replaying). A stub whose
// last incoming link goes away stays, as the stub node would in Neo4j.
//
// The strings the maps hold are those of the nodes now stored (see
// packNode): a key in linkedBy, and each key in its lists, is the string of
// that key's node, so a replaced node's memory is not kept alive by them.
func (s *Store) put(n *node) {
	// Assigning to a map entry with a string key stores the key given, so
	// both entries now hold n's string.
	old := s.nodes[n.key]
	s.nodes[n.key] = n
	if in, ok := s.linkedBy[n.key]; ok {
		s.linkedBy[n.key] = in
	}
	if old != nil {
		for _, target := range old.links {
			if _, still := slices.BinarySearch(n.links, target); !still {
				s.unlink(target, n.key)
			}
		}
	}
	for _, target := range n.links {
		s.link(target, n.key)
	}
}

// link records that from links to target (from's string replacing an
// equal one already recorded), creating target's stub if it has no node.
func (s *Store) link(target, from string) {
	t, ok := s.nodes[target]
	if !ok {
		t = &node{key: strings.Clone(target), stub: true}
		s.nodes[t.key] = t
	}
	in := s.linkedBy[t.key]
	if i, found := slices.BinarySearch(in, from); found {
		in[i] = from
	} else {
		s.linkedBy[t.key] = slices.Insert(in, i, from)
	}
}

func (s *Store) unlink(target, from string) {
	if t := s.nodes[target]; t != nil {
		target = t.key // the string the entry is to keep
	}
	in := s.linkedBy[target]
	i, found := slices.BinarySearch(in, from)
	if !found {
		return
	}
	if len(in) == 1 {
		delete(s.linkedBy, target)
		return
	}
	s.linkedBy[target] = slices.Delete(in, i, i+1)
}

// view copies what the graph holds about n; mu is held.
func (s *Store) view(n *node) graph.View {
	return graph.View{
		Doc: graph.Doc{Key: n.key, Version: n.version, Deleted: n.deleted, Title: n.title, ContentHash: n.contentHash,
			Links: slices.Clone(n.links), Tags: slices.Clone(n.tags), Chunks: slices.Clone(n.chunks)},
		Stub:     n.stub,
		LinkedBy: slices.Clone(s.linkedBy[n.key]),
	}
}

// read runs f with the read lock held, unless ctx is done or the store is
// closed.
func (s *Store) read(ctx context.Context, f func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.log.Closed() {
		return ErrClosed
	}
	f()
	return nil
}

// Document returns a copy of what the graph holds about key; see
// [graph.Backend].
func (s *Store) Document(ctx context.Context, key string) (v graph.View, found bool, err error) {
	err = s.read(ctx, func() {
		if n := s.nodes[key]; n != nil {
			v, found = s.view(n), true
		}
	})
	return v, found, err
}

// scanBatch is how many nodes ScanDocuments copies per hold of the lock.
const scanBatch = 512

// ScanDocuments calls fn with a copy of every node, stubs included; see
// [graph.Backend]. fn runs without the store's lock held; the keys are
// those present when the scan starts (nodes are never removed), each read
// as it is when its turn comes.
func (s *Store) ScanDocuments(ctx context.Context, fn func(graph.View) error) error {
	var keys []string
	if err := s.read(ctx, func() {
		keys = make([]string, 0, len(s.nodes))
		for k := range s.nodes {
			keys = append(keys, k)
		}
	}); err != nil {
		return err
	}
	views := make([]graph.View, 0, min(scanBatch, len(keys)))
	for batch := range slices.Chunk(keys, scanBatch) {
		if err := s.read(ctx, func() {
			views = views[:0]
			for _, k := range batch {
				views = append(views, s.view(s.nodes[k]))
			}
		}); err != nil {
			return err
		}
		for _, v := range views {
			if err := fn(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close stops background work, syncs the log and releases the directory.
// It reports a failed sync or write whose outcome on disk is unknown.
// Calls after the first return nil.
func (s *Store) Close() error { return s.log.Close() }

var _ graph.Backend = (*Store)(nil)
