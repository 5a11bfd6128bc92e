//go:build linux

package e2e_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	vpostgres "github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// verifyStores runs converge verify's comparison of the index and the
// graph with Postgres, through the projectors' HTTP endpoints, and returns
// the differences as "store problem key"; opts tune the index's side.
func verifyStores(t *testing.T, p *pipeline, ix index.Backend, g graph.Backend, opts ...verify.ReadOption) []string {
	t.Helper()
	ctx := context.Background()
	truth := &vpostgres.Postgres{Pool: p.Pool}
	var out []string
	for _, s := range []struct {
		kind verify.Kind
		read func(context.Context) ([]verify.Doc, error)
	}{
		{verify.Index, func(ctx context.Context) ([]verify.Doc, error) { return verify.ReadIndex(ctx, ix, opts...) }},
		{verify.Graph, func(ctx context.Context) ([]verify.Doc, error) { return verify.ReadGraph(ctx, g) }},
	} {
		srv := httptest.NewServer(verify.Handler(s.kind, s.read))
		side := &verify.Remote{Label: string(s.kind), Addr: strings.TrimPrefix(srv.URL, "http://")}
		rep, err := verify.Compare(ctx, truth, side, s.kind, verify.DefaultBuckets, nil)
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Documents == 0 {
			t.Fatalf("verify of the %s compared no documents", s.kind)
		}
		for _, d := range rep.Differences {
			out = append(out, string(s.kind)+" "+d.Problem+" "+d.Key)
		}
	}
	slices.Sort(out)
	return out
}

// A projection damaged behind its projector's back is repaired through the
// normal path: the index loses one document's points, the graph holds
// another document's version with fewer chunks; re-applying their events
// normally changes nothing (the stores hold their versions); verify names
// exactly those documents; re-emitting them through the writer's store
// publishes them again as repairs, both projections converge, and verify
// agrees.
func TestDamagedProjectionsAreRepairedByReemission(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t)
	ix := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = ix.Close() })
	x, err := newIndex(ctx, ix)
	if err != nil {
		t.Fatal(err)
	}
	gs := openGraph(t, t.TempDir())
	t.Cleanup(func() { _ = gs.Close() })
	g, err := graph.New(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	runProjector(t, p, x, "index")
	runProjector(t, p, g, "graph")
	p.write(t, 300, 50)
	converge(t, p.Pool, ix, embeddedPoints(ix), 60*time.Second)
	convergeGraph(t, p.Pool, gs, 60*time.Second)
	if d := verifyStores(t, p, ix, gs); len(d) != 0 {
		t.Fatalf("verify of converged stores: %v", d)
	}

	// Two documents of several chunks, written no more from here on.
	rows, err := p.Pool.Query(ctx, `SELECT key FROM documents WHERE NOT deleted AND chunk_count >= 2 ORDER BY key LIMIT 2`)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 2 {
		t.Fatalf("found %d documents of several chunks, want 2", len(keys))
	}
	inIndex, inGraph := keys[0], keys[1]

	// Damage behind the projectors' back.
	if err := ix.DeleteStale(ctx, []index.Keep{{Key: inIndex}}); err != nil {
		t.Fatal(err)
	}
	v, ok, err := gs.Document(ctx, inGraph)
	if err != nil || !ok {
		t.Fatalf("graph document %s: %v %v", inGraph, ok, err)
	}
	damaged := v.Doc
	damaged.Chunks, damaged.Repair = damaged.Chunks[:1], true
	if applied, err := gs.Apply(ctx, []graph.Doc{damaged}); err != nil || !applied[0] {
		t.Fatalf("damaging %s in the graph: %v %v", inGraph, applied, err)
	}
	want := []string{"graph stale_chunks " + inGraph, "index stale_chunks " + inIndex}
	if d := verifyStores(t, p, ix, gs); !slices.Equal(d, want) {
		t.Fatalf("verify after the damage: %v, want %v", d, want)
	}

	// A plain redelivery of their events is skipped: the stores hold
	// their versions.
	for _, key := range keys {
		var payload string
		if err := p.Pool.QueryRow(ctx, `SELECT payload::text FROM outbox o JOIN documents d USING (key, version) WHERE key = $1`, key).Scan(&payload); err != nil {
			t.Fatal(err)
		}
		if _, err := p.JetStream.Publish(ctx, contract.Subject(key), []byte(payload)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "the redeliveries to be consumed", 30*time.Second, func() bool {
		return caughtUp(t, p.JetStream, "index") && caughtUp(t, p.JetStream, "graph")
	})
	if d := verifyStores(t, p, ix, gs); !slices.Equal(d, want) {
		t.Fatalf("verify after a plain redelivery: %v, want %v (still damaged)", d, want)
	}

	// The repair: a re-emission through the writer's store.
	got, err := p.store.Reemit(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Reemitted) != 2 || len(got.NotFound) != 0 {
		t.Fatalf("re-emitted %+v", got)
	}
	converge(t, p.Pool, ix, embeddedPoints(ix), 60*time.Second)
	convergeGraph(t, p.Pool, gs, 60*time.Second)
	if d := verifyStores(t, p, ix, gs); len(d) != 0 {
		t.Fatalf("verify after the repair: %v", d)
	}
	// The stream carries the re-emissions as such.
	s, err := p.JetStream.Stream(ctx, "CONVERGE_DOCS")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got.Reemitted {
		m, err := s.GetLastMsgForSubject(ctx, contract.Subject(r.Key))
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(contract.HeaderReemission) == "" || !strings.HasPrefix(m.Header.Get("Nats-Msg-Id"), r.EventID.String()+".") {
			t.Fatalf("the last message of %s has headers %v, want a re-emission", r.Key, m.Header)
		}
	}
	t.Logf("repaired %s in the index and %s in the graph by re-emission", inIndex, inGraph)
}
