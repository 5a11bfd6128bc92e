package indexprojector_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

const updateAliases = "Collections/UpdateAliases"

// qdrantServer is a Qdrant the generation tests run on: the in-process
// model, which counts calls and fails them on demand, or the test Qdrant
// server, where a test's collections and aliases carry its own prefix.
type qdrantServer struct {
	addr, apiKey string
	// alias is the configured collection name, which Stores keep as an
	// alias.
	alias string
	model *qdranttest.Server // nil on the real server
}

func modelServer(t *testing.T) *qdrantServer {
	srv := qdranttest.Start(t)
	return &qdrantServer{addr: srv.Addr(), alias: "chunks", model: srv}
}

func realServer(t *testing.T) *qdrantServer {
	q := testenv.LeaseQdrant(t)
	return &qdrantServer{addr: q.URL, apiKey: q.APIKey, alias: q.Collection}
}

// forEachQdrant runs fn as a subtest on the model and on the real server.
func forEachQdrant(t *testing.T, fn func(t *testing.T, srv *qdrantServer)) {
	t.Run("qdranttest", func(t *testing.T) { fn(t, modelServer(t)) })
	t.Run("qdrant", func(t *testing.T) { fn(t, realServer(t)) })
}

// calls is how many calls of method the model has had; ok is false on
// the real server, which does not count them.
func (srv *qdrantServer) calls(method string) (n int, ok bool) {
	if srv.model == nil {
		return 0, false
	}
	return srv.model.Calls(method), true
}

func qdrantConfig(srv *qdrantServer) *indexprojector.Config {
	return &indexprojector.Config{QdrantURL: srv.addr, QdrantAPIKey: srv.apiKey, QdrantCollection: srv.alias}
}

func newStores(t *testing.T, srv *qdrantServer) *indexprojector.Stores {
	t.Helper()
	s, err := indexprojector.NewStores(context.Background(), qdrantConfig(srv), index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// backendOn connects to the collection (or alias) name on srv, to look at
// the server from outside the Stores.
func backendOn(t *testing.T, srv *qdrantServer, name string) *qdrant.Backend {
	t.Helper()
	b, err := qdrant.New(context.Background(), qdrant.Config{Addr: srv.addr, APIKey: srv.apiKey, Collection: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// collections lists the collections of the test on srv: the alias's name
// and those named after it (aliases are not collections).
func collections(t *testing.T, srv *qdrantServer) []string {
	t.Helper()
	host, port, err := net.SplitHostPort(srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	c, err := qd.NewClient(&qd.Config{Host: host, Port: p, APIKey: srv.apiKey, SkipCompatibilityCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	names, err := c.ListCollections(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	names = slices.DeleteFunc(names, func(name string) bool { return name != srv.alias && !strings.HasPrefix(name, srv.alias+"_") })
	slices.Sort(names)
	return names
}

func aliasTarget(t *testing.T, srv *qdrantServer, admin *qdrant.Backend) string {
	t.Helper()
	target, err := admin.AliasTarget(context.Background(), srv.alias)
	if err != nil {
		t.Fatal(err)
	}
	return target
}

func open(t *testing.T, s *indexprojector.Stores, name string) *rebuild.Generation {
	t.Helper()
	g, err := s.Open(context.Background(), name)
	if err != nil {
		t.Fatalf("Open(%q): %v", name, err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

func live(t *testing.T, s *indexprojector.Stores) string {
	t.Helper()
	name, err := s.Live(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func upserted(t testing.TB, key string, version int64) *contract.Event {
	t.Helper()
	ev := rebuildtest.Event(t, key, version)
	return &ev
}

// put applies one document to the generation g.
func put(t *testing.T, g *rebuild.Generation, key string) {
	t.Helper()
	for _, r := range g.Store.Apply(context.Background(), []*contract.Event{upserted(t, key, 1)}) {
		if r.Err != nil {
			t.Fatalf("apply %s to %s: %v", key, g.Name, r.Err)
		}
	}
}

// keys lists the documents that b (a collection or an alias) holds.
func keys(t *testing.T, b index.Backend) []string {
	t.Helper()
	docs, err := verify.ReadIndex(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(docs))
	for _, d := range docs {
		out = append(out, d.Key)
	}
	slices.Sort(out)
	return out
}

// On an empty server the first generation is <collection>_1, and opening
// it creates the collection and the alias at once; a later process finds
// it through the alias.
func TestQdrantFirstGenerationCreatesTheAlias(t *testing.T) {
	forEachQdrant(t, testQdrantFirstGenerationCreatesTheAlias)
}

func testQdrantFirstGenerationCreatesTheAlias(t *testing.T, srv *qdrantServer) {
	alias := srv.alias
	admin := backendOn(t, srv, alias)
	ctx := context.Background()
	s := newStores(t, srv)

	first := live(t, s)
	if first != alias+"_1" {
		t.Fatalf("Live on an empty server: %q; want %q", first, alias+"_1")
	}
	if got := collections(t, srv); len(got) != 0 {
		t.Fatalf("Live created collections %v; want none before Open", got)
	}
	g := open(t, s, first)
	if g.Name != first {
		t.Errorf("generation name %q; want %q", g.Name, first)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{first}) {
		t.Fatalf("collections after Open: %v; want [%s]", got, first)
	}
	if target := aliasTarget(t, srv, admin); target != first {
		t.Fatalf("alias %s names %q after Open; want %q", alias, target, first)
	}
	if n, ok := srv.calls(updateAliases); ok && n != 1 {
		t.Errorf("%d UpdateAliases calls; want 1", n)
	}

	// What the generation holds is what the alias serves.
	put(t, g, "doc-a")
	if got := keys(t, admin); !slices.Equal(got, []string{"doc-a"}) {
		t.Errorf("documents through the alias: %v; want [doc-a]", got)
	}

	// A second process: Live follows the alias, and opening the live
	// generation again leaves the alias alone.
	s2 := newStores(t, srv)
	if got := live(t, s2); got != first {
		t.Fatalf("Live of a second Stores: %q; want %q", got, first)
	}
	g2 := open(t, s2, first)
	if got := keys(t, backendOf(g2)); !slices.Equal(got, []string{"doc-a"}) {
		t.Errorf("documents of the reopened generation: %v; want [doc-a]", got)
	}
	if n, ok := srv.calls(updateAliases); ok && n != 1 {
		t.Errorf("%d UpdateAliases calls after reopening; want still 1", n)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{first}) {
		t.Errorf("collections after reopening: %v; want [%s]", got, first)
	}
	if exists, err := admin.CollectionExists(ctx, alias); err != nil || exists {
		t.Errorf("a collection named %s: %v, %v; want only the alias", alias, exists, err)
	}
}

// A fresh generation is a collection of its own that the alias does not
// name until Activate moves it, in one UpdateAliases call; then the old
// collection can be dropped, the live one cannot.
func TestQdrantActivateMovesTheAlias(t *testing.T) { forEachQdrant(t, testQdrantActivateMovesTheAlias) }

func testQdrantActivateMovesTheAlias(t *testing.T, srv *qdrantServer) {
	alias := srv.alias
	admin := backendOn(t, srv, alias)
	ctx := context.Background()
	s := newStores(t, srv)

	old := live(t, s)
	gOld := open(t, s, old)
	put(t, gOld, "doc-old")

	fresh := s.Fresh()
	if fresh == old || fresh == alias || !strings.HasPrefix(fresh, alias+"_") {
		t.Fatalf("Fresh: %q; want a new %s_... name (live %q)", fresh, alias, old)
	}
	calls, _ := srv.calls(updateAliases)
	gFresh := open(t, s, fresh)
	put(t, gFresh, "doc-fresh")
	if got := collections(t, srv); !slices.Equal(got, sorted(old, fresh)) {
		t.Fatalf("collections after opening the fresh generation: %v; want [%s %s]", got, old, fresh)
	}
	if n, ok := srv.calls(updateAliases); ok && n != calls {
		t.Errorf("opening the fresh generation made %d UpdateAliases calls; want none", n-calls)
	}
	if target := aliasTarget(t, srv, admin); target != old {
		t.Fatalf("alias names %q after opening the fresh generation; want still %q", target, old)
	}
	if got := live(t, s); got != old {
		t.Fatalf("Live before Activate: %q; want %q", got, old)
	}
	if got := keys(t, admin); !slices.Equal(got, []string{"doc-old"}) {
		t.Errorf("documents through the alias before Activate: %v; want [doc-old]", got)
	}
	// Another fresh name now differs from the one just created, even
	// within the same second.
	if again := s.Fresh(); again == fresh || again == old {
		t.Errorf("Fresh after creating %q: %q; want a name no collection has", fresh, again)
	}

	if err := s.Activate(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if n, ok := srv.calls(updateAliases); ok && n != calls+1 {
		t.Errorf("Activate made %d UpdateAliases calls; want 1", n-calls)
	}
	if target := aliasTarget(t, srv, admin); target != fresh {
		t.Fatalf("alias names %q after Activate; want %q", target, fresh)
	}
	if got := live(t, s); got != fresh {
		t.Fatalf("Live after Activate: %q; want %q", got, fresh)
	}
	if got := keys(t, admin); !slices.Equal(got, []string{"doc-fresh"}) {
		t.Errorf("documents through the alias after Activate: %v; want [doc-fresh]", got)
	}
	if err := s.Activate(ctx, fresh); err != nil {
		t.Fatalf("Activate again: %v", err)
	}
	if target := aliasTarget(t, srv, admin); target != fresh {
		t.Fatalf("alias names %q after a second Activate; want %q", target, fresh)
	}

	// The live generation is not dropped, and the alias survives.
	if err := s.Drop(ctx, fresh); err == nil {
		t.Fatalf("Drop of the live generation %q succeeded", fresh)
	}
	if target := aliasTarget(t, srv, admin); target != fresh {
		t.Fatalf("alias names %q after a refused Drop; want %q", target, fresh)
	}
	if err := s.Drop(ctx, old); err != nil {
		t.Fatalf("Drop(%q): %v", old, err)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{fresh}) {
		t.Fatalf("collections after dropping %q: %v; want [%s]", old, got, fresh)
	}
	// Dropped already, never created, or the alias's own name: nothing to do.
	for _, name := range []string{old, alias + "_missing", alias} {
		if err := s.Drop(ctx, name); err != nil {
			t.Errorf("Drop(%q): %v; want nil", name, err)
		}
	}
	if got := collections(t, srv); !slices.Equal(got, []string{fresh}) {
		t.Errorf("collections at the end: %v; want [%s]", got, fresh)
	}
	if target := aliasTarget(t, srv, admin); target != fresh {
		t.Errorf("alias names %q at the end; want %q", target, fresh)
	}
	if got := keys(t, admin); !slices.Equal(got, []string{"doc-fresh"}) {
		t.Errorf("documents through the alias at the end: %v; want [doc-fresh]", got)
	}
}

func sorted(names ...string) []string {
	slices.Sort(names)
	return names
}

// A plain collection under the configured name (a store from before
// aliases) is the live generation until a fresh one is activated, which
// replaces it with the alias.
func TestQdrantLegacyCollectionGivesWayToTheAlias(t *testing.T) {
	forEachQdrant(t, testQdrantLegacyCollectionGivesWayToTheAlias)
}

func testQdrantLegacyCollectionGivesWayToTheAlias(t *testing.T, srv *qdrantServer) {
	alias := srv.alias
	ctx := context.Background()
	plain := backendOn(t, srv, alias)
	if err := plain.Ensure(ctx, embed.DefaultHashDimension); err != nil {
		t.Fatal(err)
	}
	s := newStores(t, srv)

	if got := live(t, s); got != alias {
		t.Fatalf("Live with a plain collection %s: %q; want %q", alias, got, alias)
	}
	gOld := open(t, s, alias)
	put(t, gOld, "doc-old")
	fresh := s.Fresh()
	if fresh == alias {
		t.Fatalf("Fresh: %q, the plain collection's name", fresh)
	}
	gFresh := open(t, s, fresh)
	put(t, gFresh, "doc-fresh")
	if n, ok := srv.calls(updateAliases); ok && n != 0 {
		t.Fatalf("%d UpdateAliases calls before Activate; want none beside a plain collection", n)
	}
	if got := collections(t, srv); !slices.Equal(got, sorted(alias, fresh)) {
		t.Fatalf("collections before Activate: %v; want [%s %s]", got, alias, fresh)
	}
	if got := live(t, s); got != alias {
		t.Fatalf("Live before Activate: %q; want %q", got, alias)
	}

	if err := s.Activate(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{fresh}) {
		t.Fatalf("collections after Activate: %v; want [%s] (the plain one dropped)", got, fresh)
	}
	if target := aliasTarget(t, srv, plain); target != fresh {
		t.Fatalf("alias names %q after Activate; want %q", target, fresh)
	}
	if n, ok := srv.calls(updateAliases); ok && n != 1 {
		t.Errorf("%d UpdateAliases calls; want 1", n)
	}
	if got := live(t, s); got != fresh {
		t.Fatalf("Live after Activate: %q; want %q", got, fresh)
	}
	// The name now resolves to the fresh generation, for a backend opened
	// before the switch too.
	if got := keys(t, plain); !slices.Equal(got, []string{"doc-fresh"}) {
		t.Errorf("documents under %s after Activate: %v; want [doc-fresh]", alias, got)
	}

	// What the rebuild does next: Activate again after a crash, and drop
	// the previous generation, whose name is now the alias.
	if err := s.Activate(ctx, fresh); err != nil {
		t.Fatalf("Activate again: %v", err)
	}
	if err := s.Drop(ctx, alias); err != nil {
		t.Fatalf("Drop(%q) after the switch: %v", alias, err)
	}
	if target := aliasTarget(t, srv, plain); target != fresh {
		t.Errorf("alias names %q after dropping the previous generation; want %q", target, fresh)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{fresh}) {
		t.Errorf("collections at the end: %v; want [%s]", got, fresh)
	}
}

// natsEnv is an embedded NATS with the documents' stream.
type natsEnv struct {
	js jetstream.JetStream
}

func newNATSEnv(t *testing.T) *natsEnv { return &natsEnv{js: rebuildtest.Stream(t)} }

func (e *natsEnv) publish(t testing.TB, key string, version int64) {
	t.Helper()
	rebuildtest.Publish(t, e.js, key, version)
}

// indexProcess is an index projector process on Qdrant.
type indexProcess struct {
	*rebuildtest.Process
	stores *indexprojector.Stores
}

func startIndexProcess(t *testing.T, e *natsEnv, srv *qdrantServer) *indexProcess {
	t.Helper()
	stores, err := indexprojector.NewStores(context.Background(), qdrantConfig(srv), index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &indexProcess{Process: rebuildtest.Start(t, e.js, stores, projector.Config{Name: "index", BatchSize: 64}), stores: stores}
}

func (p *indexProcess) stop() {
	p.Stop()
	_ = p.stores.Close()
}

// liveBackend is the backend of the generation live now.
func (p *indexProcess) liveBackend() index.Backend { return backendOf(p.Switch.Live()) }

// backendOf is the whole store under the index of generation g (its index
// sees only the roles it writes and reads with).
func backendOf(g *rebuild.Generation) index.Backend {
	return g.Store.(*index.Index).Backend().(index.Backend)
}

// load publishes doc-000 .. doc-<n-1> at version 1 and waits until the
// live generation holds them.
func (p *indexProcess) load(t *testing.T, e *natsEnv, n int) {
	t.Helper()
	want := make(map[string]int64, n)
	for i := range n {
		key := fmt.Sprintf("doc-%03d", i)
		e.publish(t, key, 1)
		want[key] = 1
	}
	testenv.Eventually(t, "the live generation to hold every document", 30*time.Second, holds(t, p.liveBackend, want))
}

// contents is what the live generation holds: key -> version, and the
// keys whose marker has no chunks.
func (p *indexProcess) contents(t *testing.T) (map[string]int64, []string) {
	t.Helper()
	return contentsOf(t, p.liveBackend())
}

func contentsOf(t *testing.T, b index.Backend) (map[string]int64, []string) {
	t.Helper()
	docs, err := verify.ReadIndex(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(docs))
	var empty []string
	for _, d := range docs {
		out[d.Key] = d.Version
		if len(d.Chunks) == 0 {
			empty = append(empty, d.Key)
		}
	}
	return out, empty
}

// holds reports whether b holds exactly want, every document with chunks.
func holds(t *testing.T, b func() index.Backend, want map[string]int64) func() bool {
	return func() bool {
		got, empty := contentsOf(t, b())
		return len(empty) == 0 && mapsEqual(got, want)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if w, ok := a[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A blue/green rebuild of the index on Qdrant while events keep arriving:
// the rebuilt collection holds every key at its last version (including
// one damaged behind the projector's back, which only a rebuild from
// scratch restores), the alias names it, and the previous collection is
// gone. From a store created with the alias, and from a plain collection
// created before aliases were used; on the model and the real server.
func TestQdrantBlueGreenRebuild(t *testing.T) {
	for _, tc := range []struct {
		name   string
		legacy bool
	}{{"alias", false}, {"legacy collection", true}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachQdrant(t, func(t *testing.T, srv *qdrantServer) { testQdrantBlueGreenRebuild(t, srv, tc.legacy) })
		})
	}
}

func testQdrantBlueGreenRebuild(t *testing.T, srv *qdrantServer, legacy bool) {
	ctx := context.Background()
	alias := srv.alias
	admin := backendOn(t, srv, alias)
	wantPrevious := alias + "_1"
	if legacy {
		if err := admin.Ensure(ctx, embed.DefaultHashDimension); err != nil {
			t.Fatal(err)
		}
		wantPrevious = alias
	}
	e := newNATSEnv(t)
	p := startIndexProcess(t, e, srv)
	defer func() { p.stop() }()

	const docs = 200
	p.load(t, e, docs)
	first := p.Switch.Live()
	if first.Name != wantPrevious {
		t.Fatalf("live generation %q; want %q", first.Name, wantPrevious)
	}
	if legacy {
		if n, ok := srv.calls(updateAliases); ok && n != 0 {
			t.Fatalf("%d UpdateAliases calls beside the plain collection before the rebuild; want none", n)
		}
	} else if target := aliasTarget(t, srv, admin); target != first.Name {
		t.Fatalf("alias names %q; want the live %q", target, first.Name)
	}

	// Damage behind the projector's back: the points of doc-007 go, its
	// marker stays, so the projector skips its events from now on.
	if err := first.Store.(*index.Index).Backend().DeleteStale(ctx, []index.Keep{{Key: "doc-007", Version: 0}}); err != nil {
		t.Fatal(err)
	}
	if _, empty := p.contents(t); !slices.Equal(empty, []string{"doc-007"}) {
		t.Fatalf("documents without chunks after the damage: %v; want [doc-007]", empty)
	}

	// Live traffic during the whole rebuild.
	stream, err := e.js.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	seqAtStart := stream.CachedInfo().State.LastSeq
	// doc-007 stays damaged, for the rebuild alone to restore.
	stopTraffic := rebuildtest.Traffic(t, e.js, docs, 7)
	defer stopTraffic()

	st := p.StartRebuild(t)
	if st.Previous != wantPrevious || st.InPlace || st.Target == st.Previous || !strings.HasPrefix(st.Target, alias+"_") {
		t.Fatalf("rebuild status %+v: want blue/green from %s into a fresh collection", st, wantPrevious)
	}
	// Live traffic while the rebuild runs (it may finish first: on a fast
	// server it takes less than 50 publishes).
	testenv.Eventually(t, "50 events of live traffic after the rebuild began", 30*time.Second, func() bool {
		info, err := e.js.Stream(ctx, contract.DocsStream)
		return err == nil && info.CachedInfo().State.LastSeq >= seqAtStart+50
	})
	p.WaitDone(t, st.ID, 60*time.Second)
	stopTraffic()

	want := rebuildtest.LastVersions(t, e.js)
	testenv.Eventually(t, "the rebuilt index to hold every key at its last version", 30*time.Second, holds(t, p.liveBackend, want))

	g := p.Switch.Live()
	if g.Name != st.Target || g == first {
		t.Fatalf("live generation %q; want the rebuilt %q", g.Name, st.Target)
	}
	if target := aliasTarget(t, srv, admin); target != st.Target {
		t.Fatalf("alias names %q after the rebuild; want %q", target, st.Target)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{st.Target}) {
		t.Fatalf("collections after the rebuild: %v; want only [%s]", got, st.Target)
	}
	if got := live(t, p.stores); got != st.Target {
		t.Errorf("Live after the rebuild: %q; want %q", got, st.Target)
	}
	// Readers of the alias see what the live generation holds.
	if got, empty := contentsOf(t, admin); len(empty) > 0 || !mapsEqual(got, want) {
		t.Errorf("through the alias: %d documents (%v without chunks); want the %d of the stream", len(got), empty, len(want))
	}
	if _, err := e.js.Consumer(ctx, contract.DocsStream, rebuild.ConsumerName("index")); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the rebuild consumer remains: %v", err)
	}
	if s := p.Manager.Status(ctx); s.Completed != 1 || s.DoneAt == nil || s.Error != "" {
		t.Errorf("status after the rebuild: %+v", s)
	}

	// A restarted process finds the rebuilt generation through the alias.
	p.stop()
	p = startIndexProcess(t, e, srv)
	if got := p.Switch.Live().Name; got != st.Target {
		t.Errorf("live generation of a restarted process: %q; want %q", got, st.Target)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{st.Target}) {
		t.Errorf("collections after a restart: %v; want only [%s]", got, st.Target)
	}
}

// A crash in the one moment a rebuild leaves no collection under the
// configured name: after Activate dropped a plain collection from before
// aliases, and before it created the alias. The restarted process finds
// neither, opens a fresh first collection and points the alias at it (so
// it serves only what arrives from then on, until the rebuild is done);
// the resumed rebuild then switches the alias to its target and drops that
// collection too, leaving only the target, with every document.
func TestQdrantCrashBetweenLegacyDropAndAlias(t *testing.T) {
	ctx := context.Background()
	srv := modelServer(t)
	alias := srv.alias
	admin := backendOn(t, srv, alias)
	if err := admin.Ensure(ctx, embed.DefaultHashDimension); err != nil {
		t.Fatal(err)
	}
	e := newNATSEnv(t)
	p := startIndexProcess(t, e, srv)
	defer func() { p.stop() }()
	p.load(t, e, 100)

	// Every alias change fails from now on: Activate drops the plain
	// collection, then fails to create the alias.
	srv.model.Fail(updateAliases, true)
	st := p.StartRebuild(t)
	if st.Previous != alias {
		t.Fatalf("rebuild from %q; want the plain collection %q", st.Previous, alias)
	}
	// Once Activate dropped the plain collection, each attempt fails on
	// the alias (the later ones already in opening the target, which
	// would name it too).
	testenv.Eventually(t, "Activate to drop the plain collection and fail on the alias", 60*time.Second, func() bool {
		s := p.Manager.Status(ctx)
		return srv.model.Calls(updateAliases) > 0 && !slices.Contains(collections(t, srv), alias) &&
			s.Phase == rebuild.PhaseRetrying && strings.Contains(s.Error, "switch alias "+alias)
	})
	if got := collections(t, srv); !slices.Equal(got, []string{st.Target}) {
		t.Fatalf("collections at the crash: %v; want only the target [%s]", got, st.Target)
	}
	if target := aliasTarget(t, srv, admin); target != "" {
		t.Fatalf("alias names %q at the crash; want no alias yet", target)
	}

	// The crash, and a restart once Qdrant takes alias changes again.
	p.stop()
	srv.model.Fail(updateAliases, false)
	const create = "Collections/Create"
	created := srv.model.Calls(create)
	p = startIndexProcess(t, e, srv)
	first := alias + "_1"
	// The live generation is opened before the rebuild resumes.
	if got := p.Switch.Live().Name; got != first {
		t.Fatalf("the restarted process runs on %q; want a fresh %q", got, first)
	}
	// Events keep arriving while the rebuild resumes.
	for i := range 10 {
		e.publish(t, fmt.Sprintf("doc-%03d", i), 2)
	}
	p.WaitDone(t, st.ID, 60*time.Second)
	want := rebuildtest.LastVersions(t, e.js)
	testenv.Eventually(t, "the rebuilt collection to hold every key at its last version", 30*time.Second, holds(t, p.liveBackend, want))
	if got := p.Switch.Live().Name; got != st.Target {
		t.Fatalf("live generation after the resumed rebuild: %q; want %q", got, st.Target)
	}
	if target := aliasTarget(t, srv, admin); target != st.Target {
		t.Fatalf("alias names %q after the resumed rebuild; want %q", target, st.Target)
	}
	if got := collections(t, srv); !slices.Equal(got, []string{st.Target}) {
		t.Fatalf("collections after the resumed rebuild: %v; want only [%s] (%s dropped)", got, st.Target, first)
	}
	if n := srv.model.Calls(create) - created; n != 1 {
		t.Errorf("%d collections created after the restart; want 1 (%s)", n, first)
	}
	if got, empty := contentsOf(t, admin); len(empty) > 0 || !mapsEqual(got, want) {
		t.Errorf("through the alias: %d documents (%v without chunks); want the %d of the stream", len(got), empty, len(want))
	}
}
