package embedded

import (
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/storage/textpack"
)

// The store keeps every node in memory for as long as it lives, so the
// number of objects it holds decides how long each garbage collection of
// its process spends marking them. A node as decoded is a dozen objects or
// more (its key, title and hashes, every chunk hash, link and tag, and
// their slices); packNode stores it in four: the node, one string holding
// all its text, one slice of its links and tags, and its chunks.

// packNode returns a copy of n whose strings share one allocation and
// whose links and tags share one slice (each capped at its own length).
func packNode(n *node) *node {
	size := len(n.key) + len(n.title) + len(n.contentHash)
	for _, c := range n.chunks {
		size += len(c.ContentHash)
	}
	for _, s := range n.links {
		size += len(s)
	}
	for _, s := range n.tags {
		size += len(s)
	}
	var text textpack.Builder
	text.Grow(size)
	key, title, hash := text.Put(n.key), text.Put(n.title), text.Put(n.contentHash)
	spans := make([]textpack.Span, 0, len(n.chunks)+len(n.links)+len(n.tags))
	for _, c := range n.chunks {
		spans = append(spans, text.Put(c.ContentHash))
	}
	for _, s := range n.links {
		spans = append(spans, text.Put(s))
	}
	for _, s := range n.tags {
		spans = append(spans, text.Put(s))
	}
	str := text.Text()

	cp := &node{key: str(key), stub: n.stub, deleted: n.deleted, version: n.version, title: str(title), contentHash: str(hash)}
	if n.chunks != nil {
		cp.chunks = make([]graph.Chunk, len(n.chunks))
		for i, c := range n.chunks {
			cp.chunks[i] = graph.Chunk{ID: c.ID, Ordinal: c.Ordinal, ContentHash: str(spans[i])}
		}
	}
	spans = spans[len(n.chunks):]
	if n.links == nil && n.tags == nil {
		return cp
	}
	strs := make([]string, len(spans))
	for i, s := range spans {
		strs[i] = str(s)
	}
	links, tags := len(n.links), len(n.tags)
	if n.links != nil {
		cp.links = strs[:links:links]
	}
	if n.tags != nil {
		cp.tags = strs[links : links+tags : links+tags]
	}
	return cp
}
