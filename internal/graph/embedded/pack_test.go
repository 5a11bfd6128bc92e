package embedded

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

func TestPackNodeKeepsEveryField(t *testing.T) {
	chunks := []graph.Chunk{{ID: uuid.New(), Ordinal: 0, ContentHash: "h0"}, {ID: uuid.New(), Ordinal: 1, ContentHash: ""}}
	for _, n := range []*node{
		{key: "a", version: 3, title: "Title ü", contentHash: "content", chunks: chunks, links: []string{"b", "c"}, tags: []string{"x"}},
		{key: "b", version: 1, chunks: []graph.Chunk{}, links: []string{}, tags: nil},
		{key: "c", version: 2, deleted: true, contentHash: "withdrawn"},
		{key: "stub", stub: true},
		{key: "d", version: 1, tags: []string{"only", "tags"}},
	} {
		want := *n
		want.chunks, want.links, want.tags = slices.Clone(n.chunks), slices.Clone(n.links), slices.Clone(n.tags)
		got := packNode(n)
		if len(n.links) > 0 {
			n.links[0] = "changed" // the copy owns its memory
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("packed\n %#v\nwant %#v", *got, want)
		}
		// Links and tags share one slice: appending to one must not
		// write into the other.
		_ = append(got.links, "appended")
		if !reflect.DeepEqual(got.tags, want.tags) {
			t.Errorf("an append to %q's links changed its tags: %v", n.key, got.tags)
		}
	}
}

// TestPackNodeAllocations: a node takes the same number of allocations
// whatever its number of chunks, links and tags.
func TestPackNodeAllocations(t *testing.T) {
	allocs := func(n int) float64 {
		d := upsert("doc", 1, n, nil, nil)
		for i := range n {
			d.Links = append(d.Links, fmt.Sprint("link-", i))
			d.Tags = append(d.Tags, fmt.Sprint("tag-", i))
		}
		nd := &node{key: d.Key, title: d.Title, contentHash: d.ContentHash, chunks: d.Chunks, links: d.Links, tags: d.Tags}
		return testing.AllocsPerRun(20, func() { packNode(nd) })
	}
	few, many := allocs(2), allocs(40)
	if few != many || few > 6 {
		t.Errorf("packing a node of 2 chunks, links and tags took %v allocations, of 40 each %v: want the same, at most 6", few, many)
	}
}

// BenchmarkHeldNodes measures what the garbage collector spends on nodes
// kept in memory: 30,000 documents of 3 chunks, 3 links and 2 tags, held
// as decoded (each string its own allocation) and as the store holds them,
// in the same run; see waltest.BenchmarkHeld.
func BenchmarkHeldNodes(b *testing.B) {
	const docs = 30_000
	waltest.BenchmarkHeld(b, "doc", docs, Open, func(b *testing.B, s *Store, inStore bool) any {
		var held []graph.Doc
		for d := range docs {
			links := []string{fmt.Sprint("doc-", (d+1)%docs), fmt.Sprint("doc-", (d*7)%docs), fmt.Sprint("ext-", d%100)}
			doc := upsert(fmt.Sprint("doc-", d), 1, 3, links, []string{fmt.Sprint("t", d%10), fmt.Sprint("tag-", d)})
			if !inStore {
				held = append(held, doc)
			} else if _, err := s.Apply(b.Context(), []graph.Doc{doc}); err != nil {
				b.Fatal(err)
			}
		}
		return held
	})
}
