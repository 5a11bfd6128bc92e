package embedded

import (
	"reflect"
	"testing"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// FuzzDecodeNodes checks that no payload makes the decoder panic or
// allocate beyond its size, that what decodes is a node a write could have
// stored, and that it re-encodes to the same nodes.
func FuzzDecodeNodes(f *testing.F) {
	a, _ := newNode(ptr(upsert("a", 3, 2, []string{"b", "c"}, []string{"t"})))
	w, _ := newNode(ptr(withdrawal("w", 9)))
	for _, seed := range []struct {
		op    byte
		nodes []*node
	}{
		{opApply, []*node{a, w}},
		{opNodes, []*node{a, {key: "b", stub: true}, w}},
		{opApply, nil},
	} {
		rec, err := encodeNodes(seed.op, seed.nodes)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(rec[wal.HeaderSize:])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, op := range []byte{opApply, opNodes} {
			nodes, err := decodeNodes(payload, op)
			if err != nil {
				continue
			}
			for _, n := range nodes {
				if err := n.check(op == opNodes); err != nil {
					t.Fatalf("decoded node %q: %v", n.key, err)
				}
			}
			again, err := encodeNodes(op, nodes)
			if err != nil {
				t.Fatal(err)
			}
			back, err := decodeNodes(again[wal.HeaderSize:], op)
			if err != nil || !reflect.DeepEqual(back, nodes) {
				t.Fatalf("re-encoded nodes differ: %v", err)
			}
		}
	})
}

func ptr[T any](v T) *T { return &v }
