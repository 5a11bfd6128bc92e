package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/storage/wal"
)

// graphFormat heads every log and snapshot of the graph.
var graphFormat = wal.Format{Magic: "converge-graph", Version: 1}

// Record payloads start with an op byte (the kinds the log writes itself
// are not among them) followed by a count and that many nodes:
//
//	opApply  in a log: the documents of one Apply call that passed the
//	         freshness guard, in the call's order
//	opNodes  in a snapshot: nodes, stubs included
//
// A node is its key, a flags byte, its version, title and content hash,
// its chunks (16-byte ID, ordinal, content hash), its links and its tags.
const (
	opApply byte = 2
	opNodes byte = 3
)

const (
	flagDeleted byte = 1 << iota
	flagStub
	knownFlags = flagDeleted | flagStub
)

// minNodeSize is the fewest bytes a node takes: an empty key, flags,
// version, title, hash and three empty lists.
const minNodeSize = 8

func appendNode(b []byte, n *node) []byte {
	b = wal.AppendString(b, n.key)
	var flags byte
	if n.deleted {
		flags |= flagDeleted
	}
	if n.stub {
		flags |= flagStub
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, n.version)
	b = wal.AppendString(b, n.title)
	b = wal.AppendString(b, n.contentHash)
	b = binary.AppendUvarint(b, uint64(len(n.chunks)))
	for _, c := range n.chunks {
		b = append(b, c.ID[:]...)
		b = binary.AppendVarint(b, int64(c.Ordinal))
		b = wal.AppendString(b, c.ContentHash)
	}
	b = appendStrings(b, n.links)
	return appendStrings(b, n.tags)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = wal.AppendString(b, s)
	}
	return b
}

// nodeSize bounds the bytes appendNode writes for n.
func nodeSize(n *node) int {
	size := 4*binary.MaxVarintLen64 + 1 + len(n.key) + len(n.title) + len(n.contentHash)
	for _, c := range n.chunks {
		size += 16 + 2*binary.MaxVarintLen64 + len(c.ContentHash)
	}
	for _, s := range n.links {
		size += binary.MaxVarintLen64 + len(s)
	}
	for _, s := range n.tags {
		size += binary.MaxVarintLen64 + len(s)
	}
	return size + 3*binary.MaxVarintLen64
}

// encodeNodes seals a record of op holding nodes.
func encodeNodes(op byte, nodes []*node) ([]byte, error) { return encodeNodesInto(nil, op, nodes) }

// encodeNodesInto is encodeNodes reusing buf (see wal.SealListInto).
func encodeNodesInto(buf []byte, op byte, nodes []*node) ([]byte, error) {
	return wal.SealListInto(buf, op, nodes, nodeSize, appendNode)
}

func decodeStrings(d *wal.Decoder) []string {
	n := d.Count(1)
	if n == 0 {
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.Str()
	}
	return ss
}

func decodeNode(d *wal.Decoder) *node {
	n := &node{key: d.Str()}
	flags := d.Byte()
	if flags&^knownFlags != 0 {
		d.Fail(fmt.Errorf("unknown node flags %#x", flags))
	}
	n.deleted, n.stub = flags&flagDeleted != 0, flags&flagStub != 0
	n.version = d.Varint()
	n.title = d.Str()
	n.contentHash = d.Str()
	if count := d.Count(18); count > 0 {
		n.chunks = make([]graph.Chunk, count)
		for i := range n.chunks {
			if id := d.Fixed(16); id != nil {
				n.chunks[i].ID = uuid.UUID(id)
			}
			n.chunks[i].Ordinal = int(d.Varint())
			n.chunks[i].ContentHash = d.Str()
		}
	}
	n.links = decodeStrings(d)
	n.tags = decodeStrings(d)
	return n
}

// decodeNodes decodes a record of op. Strings are copied, so the payload
// may be reused.
func decodeNodes(payload []byte, op byte) ([]*node, error) {
	d := wal.NewDecoder(payload)
	if got := d.Byte(); d.Err() == nil && got != op {
		return nil, fmt.Errorf("unexpected op %d (want %d)", got, op)
	}
	nodes := make([]*node, d.Count(minNodeSize))
	for i := range nodes {
		nodes[i] = decodeNode(d)
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if err := n.check(op == opNodes); err != nil {
			return nil, fmt.Errorf("node %q: %w", n.key, err)
		}
	}
	return nodes, nil
}

// check reports a node that no write could have stored.
func (n *node) check(stubAllowed bool) error {
	switch {
	case n.key == "":
		return errors.New("empty key")
	case n.stub && !stubAllowed:
		return errors.New("a stub where only written documents belong")
	case n.stub && (n.version != 0 || n.deleted || n.title != "" || n.contentHash != "" || n.edges() != 0):
		return errors.New("a stub with content")
	case n.deleted && n.edges() != 0:
		return errors.New("a withdrawn document with chunks, links or tags")
	}
	for _, l := range n.links {
		if l == "" {
			return errors.New("a link to an empty key")
		}
	}
	return nil
}

func (n *node) edges() int { return len(n.chunks) + len(n.links) + len(n.tags) }
