package graphprojector_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/graphtest"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// publishLinked publishes version 1 of doc-<i>, linking two other
// documents, tagged with a tag every document shares and one of five.
func publishLinked(t *testing.T, js jetstream.JetStream, i, docs int) {
	t.Helper()
	d, err := contract.Document{Key: fmt.Sprintf("doc-%03d", i), Version: 1, Title: "t",
		Body:  fmt.Sprintf("body of document %d", i),
		Links: []string{fmt.Sprintf("doc-%03d", (i+1)%docs), fmt.Sprintf("doc-%03d", (i*7)%docs)},
		Tags:  []string{"shared", fmt.Sprint("t", i%5)}}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	data, err := contract.NewUpsertedEvent(d, []string{d.Body}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(contract.Subject(d.Key))
	m.Data = data
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// versions reads the version of every written (not stub) document.
func versions(t *testing.T, b graph.Backend) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if err := b.ScanDocuments(context.Background(), func(v graph.View) error {
		if !v.Stub {
			out[v.Key] = v.Version
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The graph in Neo4j is rebuilt in place, as converge rebuild graph does
// it there, while events keep arriving: the rebuild wipes the database (a
// document written behind the projector's back goes with it) and fills it
// from the stream's start; the process is stopped in the middle of the
// fill, and the next one resumes the same rebuild to its end; then the
// graph holds every key of the stream at its last version, and nothing
// else.
func TestNeo4jRebuildInPlaceUnderTrafficInterruptedAndResumed(t *testing.T) {
	js := rebuildtest.Stream(t)
	n := testenv.LeaseNeo4j(t)
	cfg := &graphprojector.Config{Neo4jURL: n.URL, Neo4jUser: n.User, Neo4jPassword: n.Password, Neo4jDatabase: "neo4j",
		Neo4jBatch: 100, DataDir: t.TempDir()}
	runtime := projector.Config{Name: "graph", BatchSize: 100}
	const docs = 1500
	for i := range docs {
		publishLinked(t, js, i, docs)
	}
	reader, err := neo4j.New(context.Background(), neo4j.Config{URL: n.URL, User: n.User, Password: n.Password})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	p := rebuildtest.Start(t, js, graphprojector.NewStores(cfg, nil), runtime)
	defer func() { p.Stop() }()
	testenv.Eventually(t, "the live graph to hold every document", 120*time.Second, func() bool {
		return len(versions(t, reader)) == docs
	})
	// Behind the projector's back: a document the stream never had.
	if _, err := reader.Apply(context.Background(), []graph.Doc{graphtest.Upsert("ghost", 1, 1, []string{"doc-000"}, []string{"shared"})}); err != nil {
		t.Fatal(err)
	}

	stopTraffic := rebuildtest.Traffic(t, js, docs, -1)
	defer stopTraffic()
	st := p.StartRebuild(t)
	if !st.InPlace {
		t.Fatalf("a rebuild of the graph in Neo4j: %+v; want in place", st)
	}
	var applied uint64
	testenv.Eventually(t, "the fill to be under way", 60*time.Second, func() bool {
		s := p.Manager.Status(context.Background())
		applied = s.AppliedSeq
		return s.Phase == rebuild.PhaseDone || (s.Phase == rebuild.PhaseFilling && applied > 0)
	})
	if p.Manager.Status(context.Background()).Phase == rebuild.PhaseDone {
		t.Fatal("the rebuild finished before it could be interrupted; make the stream longer")
	}
	p.Stop()

	p = rebuildtest.Start(t, js, graphprojector.NewStores(cfg, nil), runtime)
	p.WaitDone(t, st.ID, 180*time.Second)
	stopTraffic()
	want := rebuildtest.LastVersions(t, js)
	var got map[string]int64
	testenv.Eventually(t, "the graph to hold every key at its last version", 120*time.Second, func() bool {
		got = versions(t, reader)
		return maps.Equal(got, want)
	})
	if _, ok := got["ghost"]; ok {
		t.Fatal("the document written behind the projector's back survived the rebuild")
	}
	t.Logf("interrupted after the rebuild had applied up to sequence %d; %d documents at their last versions after the resumed rebuild",
		applied, len(want))
}

// The graph in Neo4j is rebuilt in place, the embedded graph blue/green.
func TestNewStoresRebuildsNeo4jInPlace(t *testing.T) {
	neo := graphprojector.NewStores(&graphprojector.Config{Neo4jURL: "bolt://localhost:7687", Neo4jDatabase: "neo4j", DataDir: t.TempDir()}, nil)
	if _, ok := neo.(rebuild.InPlace); !ok {
		t.Errorf("the stores of a Neo4j graph (%T) are not rebuilt in place", neo)
	}
	if _, ok := neo.(rebuild.BlueGreen); ok {
		t.Errorf("the stores of a Neo4j graph (%T) are also rebuilt blue/green", neo)
	}
	emb := graphprojector.NewStores(&graphprojector.Config{DataDir: t.TempDir()}, nil)
	if _, ok := emb.(rebuild.BlueGreen); !ok {
		t.Errorf("the stores of the embedded graph (%T) are not rebuilt blue/green", emb)
	}
	if _, ok := emb.(rebuild.InPlace); ok {
		t.Errorf("the stores of the embedded graph (%T) are also rebuilt in place", emb)
	}
}
