package embedded

import (
	"slices"

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
	cp := &node{key: n.key, stub: n.stub, deleted: n.deleted, version: n.version, title: n.title, contentHash: n.contentHash}
	strs := make([]*string, 0, 3+len(n.chunks)+len(n.links)+len(n.tags))
	strs = append(strs, &cp.key, &cp.title, &cp.contentHash)
	if n.chunks != nil {
		cp.chunks = slices.Clone(n.chunks)
		for i := range cp.chunks {
			strs = append(strs, &cp.chunks[i].ContentHash)
		}
	}
	if n.links != nil || n.tags != nil {
		both := append(append(make([]string, 0, len(n.links)+len(n.tags)), n.links...), n.tags...)
		for i := range both {
			strs = append(strs, &both[i])
		}
		links := len(n.links)
		if n.links != nil {
			cp.links = both[:links:links]
		}
		if n.tags != nil {
			cp.tags = both[links:len(both):len(both)]
		}
	}
	textpack.Pack(strs)
	return cp
}
