package neo4j

import (
	"maps"
	"slices"
	"testing"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/pkg/contract"
)

// ScanKeys names every document the graph holds anything of, one whose
// node is gone but not its chunks included. WipeDocuments forgets the
// documents named as if no event of theirs had been applied, and nothing
// else: one another document links to stays as the stub that link made,
// one only they linked to (or itself) goes, a withdrawn one goes, the
// others keep what they hold; WipeChunks deletes the chunks whose node is
// gone. Applied again, their events give back the graph as it was. On
// the model and on the real server, which alone checks the Cypher.
func TestWipeDocuments(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		r := newFakeRunner()
		testWipeDocuments(t, newTestBackend(r, 2), func() int { return len(r.graph.chunks) }, func(key string) { delete(r.graph.docs, key) })
	})
	t.Run("neo4j", func(t *testing.T) {
		b := newServerBackend(t, Config{BatchSize: 2})
		run := func(cypher string, params map[string]any) *neo4j.EagerResult {
			t.Helper()
			res, err := neo4j.ExecuteQuery(ctx(), b.driver, cypher, params, neo4j.EagerResultTransformer, neo4j.ExecuteQueryWithDatabase(b.cfg.Database))
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		drop := func(key string) { run("MATCH (d:Document {key: $key}) DETACH DELETE d", map[string]any{"key": key}) }
		testWipeDocuments(t, b, func() int {
			res, err := neo4j.ExecuteQuery(ctx(), b.driver, "MATCH (c:Chunk) RETURN count(c) AS n", nil,
				neo4j.EagerResultTransformer, neo4j.ExecuteQueryWithDatabase(b.cfg.Database))
			if err != nil {
				t.Fatal(err)
			}
			n, _ := res.Records[0].Get("n")
			return int(n.(int64))
		}, drop)
	})
}

func testWipeDocuments(t *testing.T, b *Backend, chunks func() int, dropNode func(key string)) {
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	// a, c, d and w are wiped; b (not wiped) links to a, which links to
	// itself; d is a stub only a links to; w is withdrawn; e's node is
	// gone, its chunk left; f's too, and g's link made f again, a stub
	// that does not hold f's chunk.
	withdrawn := doc("w", 3, 0, nil, nil)
	withdrawn.Deleted = true
	docs := []graph.Doc{
		doc("a", 1, 2, []string{"a", "b", "c", "d"}, []string{"t"}),
		doc("b", 1, 1, []string{"a"}, []string{"t"}),
		doc("c", 2, 1, nil, []string{"u"}),
		withdrawn,
		doc("e", 1, 1, nil, nil),
		doc("f", 1, 1, nil, nil),
	}
	mustApply(t, b, docs...)
	dropNode("e")
	dropNode("f")
	mustApply(t, b, doc("g", 1, 1, []string{"f"}, nil))
	before := map[string]graph.View{}
	for _, key := range []string{"a", "b", "c", "d", "w"} {
		before[key] = view(t, b, key)
	}
	nodes, chunksOnly := map[string]bool{}, map[string]bool{}
	var stray []string
	if err := b.ScanKeys(ctx(), func(key, chunk string) error {
		if chunk == "" {
			nodes[key] = true
		} else {
			chunksOnly[key] = true
			stray = append(stray, chunk)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(nodes)); !slices.Equal(got, []string{"a", "b", "c", "d", "f", "g", "w"}) {
		t.Errorf("ScanKeys' document nodes: %v", got)
	}
	if got := slices.Sorted(maps.Keys(chunksOnly)); !slices.Equal(got, []string{"e", "f"}) {
		t.Errorf("ScanKeys' keys of chunks no node holds: %v; want [e f]", got)
	}
	held := contract.ChunkID("g", 1, 0).String()
	if n, err := b.WipeChunks(ctx(), append(stray, held)); err != nil || n != 2 {
		t.Errorf("WipeChunks of e's, f's and g's: %d, %v; want the 2 chunks no node holds (g's is held)", n, err)
	}
	deleted, err := b.WipeDocuments(ctx(), []string{"d", "c", "a", "a", "w"})
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 3 {
		t.Errorf("WipeDocuments deleted %d nodes; want 3 (c, d and w; a stays, b links to it)", deleted)
	}
	a := view(t, b, "a")
	if !a.Stub || a.Version != 0 || a.Title != "" || len(a.Chunks)+len(a.Links)+len(a.Tags) != 0 || !slices.Equal(a.LinkedBy, []string{"b"}) {
		t.Errorf("a after the wipe: %+v; want a stub linked by b alone", a)
	}
	for _, key := range []string{"c", "d", "w"} {
		if v, ok, err := b.Document(ctx(), key); err != nil || ok {
			t.Errorf("%s after the wipe: %+v, %v, %v; want no node", key, v, ok, err)
		}
	}
	// b keeps what it holds; a's link to it went with a.
	wantB := before["b"]
	wantB.LinkedBy = nil
	if got := view(t, b, "b"); !equalViews(got, wantB) {
		t.Errorf("b, not wiped, changed:\n got %+v\nwant %+v", got, wantB)
	}
	if n := chunks(); n != 2 {
		t.Errorf("%d chunk nodes after the wipe; want 2 (b's and g's)", n)
	}
	// The events of a, c and w again: the graph as it was.
	if applied := mustApply(t, b, docs[0], docs[2], docs[3]); !applied[0] || !applied[1] || !applied[2] {
		t.Fatalf("the wiped documents' events were not applied again: %v", applied)
	}
	for key, want := range before {
		if got := view(t, b, key); !equalViews(got, want) {
			t.Errorf("%s after the wiped documents' events again:\n got %+v\nwant %+v", key, got, want)
		}
	}
	// Nothing to wipe: nothing done.
	if n, err := b.WipeDocuments(ctx(), nil); err != nil || n != 0 {
		t.Errorf("WipeDocuments of none: %d, %v", n, err)
	}
}

func view(t *testing.T, b *Backend, key string) graph.View {
	t.Helper()
	v, ok, err := b.Document(ctx(), key)
	if err != nil || !ok {
		t.Fatalf("document %s: %v, %v", key, ok, err)
	}
	return v
}

func equalViews(a, b graph.View) bool {
	return a.Key == b.Key && a.Version == b.Version && a.Deleted == b.Deleted && a.Title == b.Title && a.ContentHash == b.ContentHash &&
		a.Stub == b.Stub && slices.Equal(a.Links, b.Links) && slices.Equal(a.Tags, b.Tags) && slices.Equal(a.LinkedBy, b.LinkedBy) &&
		slices.EqualFunc(a.Chunks, b.Chunks, func(x, y graph.Chunk) bool { return x == y })
}
