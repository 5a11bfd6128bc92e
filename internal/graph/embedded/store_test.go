package embedded

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/graphtest"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/storage/wal"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

var upsert, withdrawal = graphtest.Upsert, graphtest.Withdrawal

func openStore(t testing.TB, dir string, opts Options) *Store {
	return waltest.Open(t, Open, dir, opts)
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// applyAll applies docs and returns which were applied.
func applyAll(t testing.TB, s *Store, docs ...graph.Doc) []bool {
	t.Helper()
	applied, err := s.Apply(context.Background(), docs)
	ok(t, err)
	return applied
}

func view(t testing.TB, s *Store, key string) graph.View {
	t.Helper()
	v, found, err := s.Document(context.Background(), key)
	ok(t, err)
	if !found {
		t.Fatalf("no node %q", key)
	}
	return v
}

func linkedBy(t testing.TB, s *Store, key string, want ...string) {
	t.Helper()
	if got := view(t, s, key).LinkedBy; !slices.Equal(got, want) {
		t.Fatalf("%s linked by %q, want %q", key, got, want)
	}
}

// dump is every node as ScanDocuments returns it, after checking the
// store's invariants.
func dump(t testing.TB, s *Store) map[string]graph.View {
	t.Helper()
	checkInvariants(t, s)
	out := map[string]graph.View{}
	ok(t, s.ScanDocuments(context.Background(), func(v graph.View) error {
		if _, dup := out[v.Key]; dup {
			return fmt.Errorf("%s scanned twice", v.Key)
		}
		out[v.Key] = v
		return nil
	}))
	return out
}

func sameGraph(t testing.TB, got, want map[string]graph.View) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		for k, w := range want {
			if g, found := got[k]; !found || !reflect.DeepEqual(g, w) {
				t.Fatalf("%s: got %+v (present %v), want %+v", k, g, found, w)
			}
		}
		t.Fatalf("got %d nodes, want %d", len(got), len(want))
	}
}

// checkInvariants recomputes the reverse index from the nodes' links and
// checks every node's shape.
func checkInvariants(t testing.TB, s *Store) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	want := map[string][]string{}
	for k, n := range s.nodes {
		if err := n.check(true); err != nil || n.key != k {
			t.Fatalf("node %q (key %q): %v", k, n.key, err)
		}
		if !slices.IsSorted(n.links) || !slices.IsSorted(n.tags) {
			t.Fatalf("node %q: links or tags not sorted", k)
		}
		for _, l := range n.links {
			if s.nodes[l] == nil {
				t.Fatalf("%q links to %q, which has no node", k, l)
			}
			want[l] = append(want[l], k)
		}
	}
	for _, from := range want {
		slices.Sort(from)
	}
	if !maps.EqualFunc(want, s.linkedBy, slices.Equal[[]string]) {
		t.Fatalf("reverse index %v, recomputed %v", s.linkedBy, want)
	}
	// The reverse index holds the strings of the nodes stored, not of
	// nodes they replaced (whose memory it would keep alive).
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for k, n := range s.nodes {
		if !same(k, n.key) {
			t.Fatalf("the node of %q is keyed by a string other than its own", k)
		}
	}
	for target, from := range s.linkedBy {
		if !same(target, s.nodes[target].key) {
			t.Fatalf("the reverse index's entry %q does not hold its node's key string", target)
		}
		for _, f := range from {
			if !same(f, s.nodes[f].key) {
				t.Fatalf("the reverse index's entry %q lists %q with a string other than its node's key", target, f)
			}
			// A stub's key is its own, not a link string of a node that
			// links to it, whose whole packed text it would keep alive.
			if s.nodes[target].stub && slices.ContainsFunc(s.nodes[f].links, func(l string) bool { return same(l, target) }) {
				t.Fatalf("the stub %q holds the key string of a link of %q", target, f)
			}
		}
	}
}

// populate writes every kind of change: new documents with links to stubs,
// stubs filled in, links and tags replaced, stale versions, withdrawals,
// a document re-written after its withdrawal, and a repair of a held
// version.
func populate(t testing.TB, s *Store) {
	t.Helper()
	applyAll(t, s,
		upsert("a", 1, 3, []string{"b", "c", "stub-1"}, []string{"x", "y"}),
		upsert("b", 1, 1, []string{"a"}, nil),
		upsert("self", 4, 2, []string{"self", "a"}, []string{"me"}))
	applyAll(t, s, upsert("c", 2, 4, []string{"stub-2"}, []string{"x"}), upsert("a", 1, 9, nil, nil))
	applyAll(t, s, upsert("a", 2, 2, []string{"c", "d"}, []string{"y", "z"}))
	applyAll(t, s, withdrawal("b", 2), upsert("e", 1, 1, []string{"b"}, nil))
	applyAll(t, s, upsert("c", 3, 1, nil, nil), withdrawal("ghost", 7))
	applyAll(t, s, upsert("b", 3, 2, []string{"stub-1"}, []string{"back"}))
	repair := upsert("self", 4, 1, []string{"b"}, []string{"fixed"})
	repair.Repair = true
	if got := applyAll(t, s, repair); !got[0] {
		t.Fatal("the repair of self v4 was not applied")
	}
}

func TestPersistenceAcrossReopen(t *testing.T) {
	for _, opts := range []Options{{}, {SyncEvery: 5 * time.Millisecond}, {CompactBytes: 1024}} {
		t.Run(fmt.Sprintf("%+v", opts), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, opts)
			populate(t, s)
			want := dump(t, s)
			if len(want) != 9 || !want["stub-1"].Stub || !want["stub-2"].Stub || !want["d"].Stub || !want["ghost"].Deleted {
				t.Fatalf("unexpected graph before reopen: %d nodes", len(want))
			}
			ok(t, s.Close())

			s = openStore(t, dir, opts)
			sameGraph(t, dump(t, s), want)
			applyAll(t, s, upsert("d", 1, 1, []string{"a"}, nil))
			want = dump(t, s)
			ok(t, s.Close())
			sameGraph(t, dump(t, openStore(t, dir, opts)), want)
		})
	}
}

// TestTornTail cuts the log inside the last Apply's record: after Open,
// none of that call's documents (nor the stubs its links created) is in
// the graph, every earlier call is, and the log takes new records.
func TestTornTail(t *testing.T) {
	for _, cut := range []string{"header", "payload", "last byte"} {
		t.Run(cut, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, wal.LogName(1))
			s := openStore(t, dir, Options{})
			populate(t, s)
			want := dump(t, s)
			start := waltest.FileSize(t, path)
			applyAll(t, s, upsert("late-1", 1, 4, []string{"late-stub"}, nil), upsert("a", 9, 1, nil, nil), withdrawal("c", 9))
			end := waltest.FileSize(t, path)
			ok(t, s.Close())
			at := map[string]int64{"header": start + 5, "payload": (start + end) / 2, "last byte": end - 1}[cut]
			ok(t, os.Truncate(path, at))

			s = openStore(t, dir, Options{})
			sameGraph(t, dump(t, s), want)
			if got := waltest.FileSize(t, path); got != start {
				t.Fatalf("log is %d bytes after recovery, want %d", got, start)
			}
			applyAll(t, s, upsert("late-2", 1, 1, nil, nil))
			want = dump(t, s)
			ok(t, s.Close())
			sameGraph(t, dump(t, openStore(t, dir, Options{})), want)
		})
	}
}

func TestCorruptLogRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, wal.LogName(1))
	s := openStore(t, dir, Options{})
	applyAll(t, s, upsert("a", 1, 1, nil, nil))
	at := waltest.FileSize(t, path)
	applyAll(t, s, upsert("b", 1, 1, nil, nil))
	applyAll(t, s, upsert("c", 1, 1, nil, nil))
	ok(t, s.Close())
	b, err := os.ReadFile(path)
	ok(t, err)
	b[at+wal.HeaderSize+3] ^= 0x04
	ok(t, os.WriteFile(path, b, 0o600))
	_, err = Open(dir, Options{})
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path != path || ce.Offset != at {
		t.Fatalf("Open: %v, want corruption in %s at %d", err, path, at)
	}
}

func TestSecondOpenerLocked(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	applyAll(t, s, upsert("a", 1, 1, nil, nil))
	waltest.ExpectLocked(t, Open, dir, s)
}

func TestCompactionPreservesState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir, Options{CompactBytes: 16 << 10})
	for v := int64(1); v <= 20; v++ {
		var docs []graph.Doc
		for d := range 30 {
			docs = append(docs, upsert(fmt.Sprint("doc-", d), v, 4,
				[]string{fmt.Sprint("doc-", (d+int(v))%30), fmt.Sprint("ext-", d%7, "-", v%3)}, []string{fmt.Sprint("t", v%4)}))
		}
		applyAll(t, s, docs...)
		if v%5 == 0 {
			applyAll(t, s, withdrawal(fmt.Sprint("doc-", v), v+1))
		}
	}
	if s.log.Seq() == 1 {
		t.Fatal("no automatic compaction ran")
	}
	populate(t, s)
	ok(t, s.Compact(ctx))
	want := dump(t, s)
	ok(t, s.Close())
	// What Open reads now is the snapshot, and the log after it.
	if _, err := os.Stat(filepath.Join(dir, wal.SnapshotName)); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, Options{})
	sameGraph(t, dump(t, s), want)
	// The reopened graph goes on from the snapshot.
	applyAll(t, s, upsert("doc-1", 100, 1, []string{"fresh"}, nil))
	linkedBy(t, s, "fresh", "doc-1")
}

func TestFreshnessGuard(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	v2 := upsert("k", 2, 2, []string{"x"}, []string{"t"})
	steps := []struct {
		doc     graph.Doc
		applied bool
		holds   graph.Doc
	}{
		{v2, true, v2},
		{v2, false, v2}, // the same version
		{upsert("k", 1, 5, []string{"y"}, nil), false, v2},       // older
		{withdrawal("k", 2), false, v2},                          // a withdrawal of the same version
		{withdrawal("k", 3), true, withdrawal("k", 3)},           // newer
		{upsert("k", 3, 1, nil, nil), false, withdrawal("k", 3)}, // no resurrection at the same version
		{upsert("k", 4, 1, nil, nil), true, upsert("k", 4, 1, nil, nil)},
	}
	path := filepath.Join(dir, wal.LogName(1))
	for i, st := range steps {
		before := waltest.FileSize(t, path)
		if got := applyAll(t, s, st.doc); got[0] != st.applied {
			t.Fatalf("step %d: applied %v, want %v", i, got[0], st.applied)
		}
		graphtest.Expect(t, s, st.holds)
		if grew := waltest.FileSize(t, path) > before; grew != st.applied {
			t.Fatalf("step %d: the log grew %v, applied %v", i, grew, st.applied)
		}
	}
	if _, found, _ := s.Document(context.Background(), "y"); found {
		t.Fatal("a stale version's link created a stub")
	}
	// In one call, the guard judges each document by itself.
	got := applyAll(t, s, upsert("k", 4, 1, nil, nil), upsert("new", 1, 1, nil, nil), upsert("x", 1, 1, nil, nil))
	if !slices.Equal(got, []bool{false, true, true}) {
		t.Fatalf("applied %v", got)
	}
}

func TestLinkReplacementMovesLinkedBy(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	applyAll(t, s, upsert("a", 1, 1, []string{"b", "c"}, nil), upsert("z", 1, 1, []string{"c"}, nil))
	linkedBy(t, s, "b", "a")
	linkedBy(t, s, "c", "a", "z")
	applyAll(t, s, upsert("a", 2, 1, []string{"c", "d"}, nil))
	linkedBy(t, s, "b")
	linkedBy(t, s, "c", "a", "z")
	linkedBy(t, s, "d", "a")
	if v := view(t, s, "b"); !v.Stub {
		t.Fatalf("b, no longer linked, is %+v; want the stub kept", v)
	}
	applyAll(t, s, upsert("a", 3, 1, nil, nil))
	for _, k := range []string{"b", "d"} {
		linkedBy(t, s, k)
	}
	linkedBy(t, s, "c", "z")
	checkInvariants(t, s)
}

func TestStubsFilledIn(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	applyAll(t, s, upsert("a", 5, 1, []string{"b"}, nil))
	if v := view(t, s, "b"); !v.Stub || v.Version != 0 || v.Links != nil || v.Chunks != nil {
		t.Fatalf("stub b = %+v", v)
	}
	// A stub has no version to guard: any upsert fills it in.
	b := upsert("b", 1, 2, []string{"a", "c"}, []string{"t"})
	if got := applyAll(t, s, b); !got[0] {
		t.Fatal("the first upsert of a stub's key was not applied")
	}
	graphtest.Expect(t, s, b, "a")
	linkedBy(t, s, "a", "b")
	if !view(t, s, "c").Stub {
		t.Fatal("c, linked by the filled-in b, is not a stub")
	}
	// Linking to a written document creates no stub.
	applyAll(t, s, upsert("d", 1, 1, []string{"b"}, nil))
	graphtest.Expect(t, s, b, "a", "d")
	checkInvariants(t, s)
}

func TestWithdrawalKeepsIncomingLinks(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	applyAll(t, s, upsert("a", 1, 3, []string{"b"}, []string{"t"}), upsert("x", 1, 1, []string{"a"}, nil), upsert("y", 1, 1, []string{"a"}, nil))
	w := withdrawal("a", 2)
	applyAll(t, s, w)
	graphtest.Expect(t, s, w, "x", "y")
	linkedBy(t, s, "b")
	ok(t, s.Close())
	s = openStore(t, dir, Options{})
	graphtest.Expect(t, s, w, "x", "y")
	linkedBy(t, s, "b")
	// The links to it are withdrawn with their own documents only.
	applyAll(t, s, withdrawal("x", 2))
	graphtest.Expect(t, s, w, "y")
}

func TestCountFenceAndInvalidDocuments(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, wal.LogName(1))
	s := openStore(t, dir, Options{})
	applyAll(t, s, upsert("k", 1, 1, nil, nil))
	repeatedChunk := upsert("c", 1, 3, nil, nil)
	repeatedChunk.Chunks[2].ID = repeatedChunk.Chunks[0].ID
	manyChunks := upsert("c", 1, 40, nil, nil)
	manyChunks.Chunks[39].ID = manyChunks.Chunks[7].ID
	withLinks := withdrawal("w", 1)
	withLinks.Links = []string{"k"}
	cases := []struct {
		name string
		doc  graph.Doc
		want string
	}{
		{"repeated link", graph.Doc{Key: "d", Version: 1, Links: []string{"k", "k"}}, `"d" version 1 would hold 0 chunks, 1 links, 0 tags; the document has 0, 2, 0`},
		{"repeated tag", graph.Doc{Key: "d", Version: 1, Tags: []string{"t", "u", "t"}}, "0 chunks, 0 links, 2 tags; the document has 0, 0, 3"},
		{"repeated chunk ID", repeatedChunk, "2 chunks, 0 links, 0 tags; the document has 3, 0, 0"},
		{"repeated chunk ID of many", manyChunks, "39 chunks, 0 links, 0 tags; the document has 40, 0, 0"},
		{"empty key", graph.Doc{Version: 1}, "empty key"},
		{"link to an empty key", graph.Doc{Key: "d", Version: 1, Links: []string{""}}, "a link to an empty key"},
		{"withdrawal with links", withLinks, "a withdrawal with chunks, links or tags"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := waltest.FileSize(t, path)
			// A valid, fresh document in the same call is not written either.
			_, err := s.Apply(context.Background(), []graph.Doc{upsert("k", 2, 1, nil, nil), tc.doc})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !projector.IsPermanent(err) {
				t.Fatalf("Apply: %v, want a permanent error saying %q", err, tc.want)
			}
			var fe *FenceError
			if errors.As(err, &fe) == errors.Is(err, ErrInvalidDocs) {
				t.Fatalf("%v is both or neither a fence error and invalid documents", err)
			}
			if waltest.FileSize(t, path) != before || view(t, s, "k").Version != 1 {
				t.Fatal("the call wrote something")
			}
		})
	}
	_, err := s.Apply(context.Background(), []graph.Doc{upsert("k", 2, 1, nil, nil), upsert("k", 3, 1, nil, nil)})
	if !errors.Is(err, ErrInvalidDocs) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a key twice in one call: %v", err)
	}
	// Unsorted links and chunks out of ordinal order are stored sorted.
	d := upsert("sorted", 1, 3, nil, nil)
	d.Links, d.Tags = []string{"z", "k"}, []string{"b", "a"}
	d.Chunks[0], d.Chunks[2] = d.Chunks[2], d.Chunks[0]
	applyAll(t, s, d)
	graphtest.Expect(t, s, upsert("sorted", 1, 3, []string{"k", "z"}, []string{"a", "b"}))
}

func TestConcurrentApply(t *testing.T) {
	const writers, keys, rounds = 8, 5, 30
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir, Options{CompactBytes: 32 << 10})
	key := func(w, k int) string { return fmt.Sprintf("w%d-k%d", w, k) }
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for v := int64(1); v <= rounds; v++ {
				var docs []graph.Doc
				for k := range keys {
					// Links to the other writers' keys, which change as they write.
					links := []string{key((w+1)%writers, k), key((w+int(v))%writers, (k+1)%keys)}
					docs = append(docs, upsert(key(w, k), v, 1+int(v)%3, links, []string{fmt.Sprint("r", v%2)}))
				}
				if v%10 == 0 {
					docs[0] = withdrawal(key(w, 0), v)
				}
				if _, err := s.Apply(ctx, docs); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := s.Document(ctx, key(1, 1)); err != nil {
				t.Error(err)
				return
			}
			if err := s.ScanDocuments(ctx, func(v graph.View) error {
				if !slices.IsSorted(v.LinkedBy) {
					return fmt.Errorf("%s linked by %v", v.Key, v.LinkedBy)
				}
				return nil
			}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()

	want := dump(t, s)
	for w := range writers {
		for k := range keys {
			v := want[key(w, k)]
			if v.Version != rounds || v.Stub || v.Deleted != (k == 0) {
				t.Fatalf("%s = v%d stub %v deleted %v", key(w, k), v.Version, v.Stub, v.Deleted)
			}
		}
	}
	ok(t, s.Close())
	sameGraph(t, dump(t, openStore(t, dir, Options{})), want)
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), Options{})
	ok(t, s.Close())
	ok(t, s.Close())
	_, err := s.Apply(ctx, []graph.Doc{upsert("a", 1, 1, nil, nil)})
	_, _, derr := s.Document(ctx, "a")
	for i, err := range []error{err, derr, s.Ensure(ctx), s.Compact(ctx), s.ScanDocuments(ctx, func(graph.View) error { return nil })} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call %d after Close: %v", i, err)
		}
	}
}

func TestReadsReturnCopiesAndScanStops(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), Options{})
	a := upsert("a", 1, 2, []string{"b"}, []string{"t"})
	applyAll(t, s, a, upsert("c", 1, 1, []string{"b"}, nil))
	v := view(t, s, "a")
	v.Links[0], v.Tags[0], v.Chunks[0].Ordinal = "changed", "changed", 99
	graphtest.Expect(t, s, a)
	b := view(t, s, "b")
	b.LinkedBy[0] = "changed"
	linkedBy(t, s, "b", "a", "c")

	// A scan over more nodes than one batch stops at fn's first error.
	var docs []graph.Doc
	for i := range scanBatch {
		docs = append(docs, upsert(fmt.Sprint("many-", i), 1, 0, nil, nil))
	}
	applyAll(t, s, docs...)
	stopAt := scanBatch + 2
	var seen []string
	err := s.ScanDocuments(ctx, func(v graph.View) error {
		if seen = append(seen, v.Key); len(seen) == stopAt {
			return errors.New("enough")
		}
		return nil
	})
	if err == nil || err.Error() != "enough" || len(seen) != stopAt || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != stopAt {
		t.Fatalf("ScanDocuments: %v after %d calls", err, len(seen))
	}
	// fn runs without the lock: it may write.
	ok(t, s.ScanDocuments(ctx, func(v graph.View) error {
		_, err := s.Apply(ctx, []graph.Doc{upsert("during-"+v.Key, 1, 1, nil, nil)})
		return err
	}))
}

// A snapshot of many records (nodes of several sizes, more than two
// records' worth, the last record the shortest) reads back as the graph
// it was written from: its records share one buffer while written.
func TestSnapshotOfManyRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir, Options{CompactBytes: -1})
	const docs = 2*snapshotBatch + 37
	for d := range docs {
		// Sizes vary from node to node, so consecutive records differ.
		applyAll(t, s, upsert(fmt.Sprint("doc-", d), 1, 1+d%7,
			[]string{fmt.Sprint("doc-", (d+1)%docs), "ext-" + strings.Repeat("x", d%50)}, []string{fmt.Sprint("t", d%5)}))
	}
	ok(t, s.Compact(ctx))
	want := dump(t, s)
	ok(t, s.Close())
	sameGraph(t, dump(t, openStore(t, dir, Options{})), want)
}
