package indexprojector_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/embed/embedtest"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// publishDoc publishes the upsert of key at version with body, chunked as
// the writer chunks it.
func publishDoc(t *testing.T, js jetstream.JetStream, key string, version int64, body string) {
	t.Helper()
	d, err := contract.Document{Key: key, Version: version, Title: key, Body: body}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	rebuildtest.PublishEvent(t, js, contract.NewUpsertedEvent(d, chunking.Split(d.Body, chunking.DefaultConfig())))
}

// embedderProcess is an index projector process with its read routes
// served over HTTP, as the projector serves them, and a client of them
// (the one `converge search` uses).
type embedderProcess struct {
	*rebuildtest.Process
	stores *indexprojector.Stores
	srv    *httptest.Server
	client *index.Client
}

func startEmbedderProcess(t *testing.T, js jetstream.JetStream, cfg *indexprojector.Config) *embedderProcess {
	t.Helper()
	stores, err := indexprojector.NewStores(context.Background(), cfg, index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &embedderProcess{stores: stores, Process: rebuildtest.Start(t, js, stores,
		projector.Config{Name: "index", BatchSize: 64, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond})}
	mux := http.NewServeMux()
	for pattern, h := range p.Switch.Routes() {
		mux.Handle(pattern, h)
	}
	p.srv = httptest.NewServer(mux)
	p.client = &index.Client{Addr: strings.TrimPrefix(p.srv.URL, "http://")}
	return p
}

func (p *embedderProcess) stop() {
	p.srv.Close()
	p.Stop()
	_ = p.stores.Close()
}

func (p *embedderProcess) info(t *testing.T) index.Info {
	t.Helper()
	info, err := p.client.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// search is the best hit's key for query, through the HTTP route.
func (p *embedderProcess) search(t *testing.T, query string) string {
	t.Helper()
	res, err := p.client.Search(context.Background(), query, 3)
	if err != nil {
		t.Fatalf("search %q: %v", query, err)
	}
	if len(res.Results) == 0 {
		t.Fatalf("search %q: no results", query)
	}
	return res.Results[0].Key
}

func (p *embedderProcess) live() index.Backend { return backendOf(p.Switch.Live()) }

// embedderChange is a change of embedder on a store: the projector started
// with the new one refuses to write into the generation the old one made
// (and says to rebuild), keeps answering its searches with the old model,
// and a rebuild re-embeds everything into a fresh generation recorded with
// the new embedder, which becomes live with the events held meanwhile.
type embedderChange struct {
	config        func(embed.Config) *indexprojector.Config
	before, after embed.Config
	semantic      bool // check semanticQueries before and after
}

func (c embedderChange) run(t *testing.T) {
	js := rebuildtest.Stream(t)
	want := map[string]int64{}
	for key, body := range embedtest.Corpus {
		publishDoc(t, js, key, 1, body)
		want[key] = 1
	}
	beforeID, afterID := identity(t, c.before), identity(t, c.after)

	p := startEmbedderProcess(t, js, c.config(c.before))
	testenv.Eventually(t, "the first generation to hold the corpus", 30*time.Second, holds(t, p.live, want))
	info := p.info(t)
	if info.Embedder != beforeID || info.Configured != beforeID || info.WritesRefused != "" {
		t.Fatalf("info of the first generation: %+v; want the embedder %s, writing", info, beforeID)
	}
	first := info.Generation
	c.checkSearches(t, p)
	p.stop()

	// Started with another embedder: the generation is not written.
	p = startEmbedderProcess(t, js, c.config(c.after))
	defer func() { p.stop() }()
	info = p.info(t)
	if info.Generation != first || info.Embedder != beforeID || info.Configured != afterID ||
		!strings.Contains(info.WritesRefused, "converge rebuild index") || info.SearchError != "" {
		t.Fatalf("info with another embedder: %+v; want generation %s of %s refusing writes for %s, searches answered", info, first, beforeID, afterID)
	}
	// Searches are still answered, with the model of the stored vectors.
	c.checkSearches(t, p)
	retried := testutil.ToFloat64(p.Metrics.Retries)
	publishDoc(t, js, "late", 1, "A document written while the projector refuses to write.")
	publishDoc(t, js, "pets", 2, embedtest.Corpus["pets"]+" She chases mice in the garden.")
	want["late"], want["pets"] = 1, 2
	testenv.Eventually(t, "the refused batch to be retried three times", 30*time.Second, func() bool {
		return testutil.ToFloat64(p.Metrics.Retries) >= retried+3
	})
	if got, _ := contentsOf(t, p.live()); got["late"] != 0 || got["pets"] != 1 {
		t.Fatalf("the refusing generation holds %v; want the events held back", got)
	}
	// Held back, not dropped: the live consumer acknowledged neither (a
	// rebuild replays the whole stream, so only its position shows it).
	stream, err := js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq
	cons, err := js.Consumer(context.Background(), contract.DocsStream, "index")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ci.AckFloor.Stream > last-2 {
		t.Fatalf("the live consumer acknowledged up to %d during the refusal; want it below the two held events (stream at %d)", ci.AckFloor.Stream, last)
	}

	st := p.StartRebuild(t)
	if st.Previous != first || st.Target == first {
		t.Fatalf("rebuild %+v; want one from %s into a fresh generation", st, first)
	}
	p.WaitDone(t, st.ID, 60*time.Second)
	testenv.Eventually(t, "the rebuilt generation to hold every document, the held ones too", 30*time.Second, holds(t, p.live, want))
	info = p.info(t)
	if info.Generation != st.Target || info.Embedder != afterID || info.Configured != afterID || info.WritesRefused != "" {
		t.Fatalf("info after the rebuild: %+v; want generation %s of %s, writing", info, st.Target, afterID)
	}
	if id, ok, err := p.live().Embedder(context.Background()); err != nil || !ok || id != afterID {
		t.Fatalf("the rebuilt generation records %+v, %v, %v; want %s", id, ok, err, afterID)
	}
	c.checkSearches(t, p)
	if s := p.Manager.Status(context.Background()); s.Phase != rebuild.PhaseDone || s.Completed != 1 {
		t.Fatalf("rebuild status %+v", s)
	}
	// A restart opens the rebuilt generation and writes it.
	p.stop()
	p = startEmbedderProcess(t, js, c.config(c.after))
	publishDoc(t, js, "after", 1, "Written after the rebuild.")
	want["after"] = 1
	testenv.Eventually(t, "the rebuilt generation to take new writes", 30*time.Second, holds(t, p.live, want))
}

func (c embedderChange) checkSearches(t *testing.T, p *embedderProcess) {
	t.Helper()
	if !c.semantic {
		if got := p.search(t, embedtest.Corpus["cooking"]); got != "cooking" {
			t.Fatalf("search for the cooking document's own text found %q", got)
		}
		return
	}
	for q, key := range embedtest.Queries {
		if got := p.search(t, q); got != key {
			t.Errorf("search %q found %q first; want %q", q, got, key)
		}
	}
}

func identity(t *testing.T, cfg embed.Config) embed.Identity {
	t.Helper()
	e, err := embed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return embed.IdentityOf(e)
}

func embeddedConfig(t *testing.T) func(embed.Config) *indexprojector.Config {
	dir := t.TempDir()
	return func(e embed.Config) *indexprojector.Config { return &indexprojector.Config{DataDir: dir, Embed: e} }
}

// qdrantConfigOf configures the index on srv: the in-process model
// (modelServer) or a collection of the test Qdrant server (realServer).
func qdrantConfigOf(srv *qdrantServer) func(embed.Config) *indexprojector.Config {
	return func(e embed.Config) *indexprojector.Config {
		c := qdrantConfig(srv)
		c.Embed = e
		return c
	}
}

// lexicalServer serves /v1/embeddings with two models of 256 dimensions
// made of the hash embedder's vectors: lexical-a as they are, lexical-b
// reversed. Only the recorded identity tells their vectors apart.
func lexicalServer(t *testing.T) string {
	h, err := embed.NewHash(256)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string   `json:"model"`
			Input []string `json:"input"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || (req.Model != "lexical-a" && req.Model != "lexical-b") {
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
			return
		}
		vecs, err := h.Embed(r.Context(), req.Input)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		type item struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		}
		out := struct {
			Data []item `json:"data"`
		}{}
		for i, v := range vecs {
			if req.Model == "lexical-b" {
				slices.Reverse(v)
			}
			out.Data = append(out.Data, item{Index: i, Embedding: v})
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A change of embedder on the embedded index and on Qdrant (the
// in-process model and the real server): of the hash embedder's
// dimension, and between two models of one dimension, whose vectors only
// the recorded identity tells apart.
func TestEmbedderChangeIsRefusedUntilARebuild(t *testing.T) {
	url := lexicalServer(t)
	sameDim := []embed.Config{{URL: url, Model: "lexical-a", Dimension: 256}, {URL: url, Model: "lexical-b", Dimension: 256}}
	t.Run("embedded, same dimension", func(t *testing.T) {
		embedderChange{config: embeddedConfig(t), before: sameDim[0], after: sameDim[1]}.run(t)
	})
	t.Run("qdranttest, same dimension", func(t *testing.T) {
		embedderChange{config: qdrantConfigOf(modelServer(t)), before: sameDim[0], after: sameDim[1]}.run(t)
	})
	t.Run("qdrant, same dimension", func(t *testing.T) {
		srv := realServer(t)
		embedderChange{config: qdrantConfigOf(srv), before: sameDim[0], after: sameDim[1]}.run(t)
		onlyTheRebuiltCollection(t, srv)
	})
	before, after := embed.Config{}, embed.Config{Dimension: 128}
	t.Run("embedded", func(t *testing.T) {
		cfg := embeddedConfig(t)
		embedderChange{config: cfg, before: before, after: after}.run(t)
		// The previous generation's directory is gone; the live one
		// records the new embedder in its file.
		dir := cfg(after).DataDir
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var gens []string
		for _, e := range entries {
			if e.IsDir() {
				gens = append(gens, e.Name())
			}
		}
		if len(gens) != 1 || gens[0] == "index" {
			t.Fatalf("generations left: %v; want the rebuilt one alone", gens)
		}
		if b, err := os.ReadFile(filepath.Join(dir, gens[0], "embedder.json")); err != nil || !strings.Contains(string(b), `"dimension":128`) {
			t.Fatalf("embedder.json of the rebuilt generation: %s, %v", b, err)
		}
	})
	t.Run("qdranttest", func(t *testing.T) {
		embedderChange{config: qdrantConfigOf(modelServer(t)), before: before, after: after}.run(t)
	})
	t.Run("qdrant", func(t *testing.T) {
		srv := realServer(t)
		embedderChange{config: qdrantConfigOf(srv), before: before, after: after}.run(t)
		onlyTheRebuiltCollection(t, srv)
	})
}

// onlyTheRebuiltCollection checks that after an embedder change on srv
// the alias names the rebuilt collection, which records the new
// embedder, and that the first one is gone.
func onlyTheRebuiltCollection(t *testing.T, srv *qdrantServer) {
	t.Helper()
	target := aliasTarget(t, srv, backendOn(t, srv, srv.alias))
	if got := collections(t, srv); target == srv.alias+"_1" || !slices.Equal(got, []string{target}) {
		t.Fatalf("collections after the rebuild: %v, the alias naming %q; want the rebuilt one alone", got, target)
	}
}

// From one real model to another (the same model truncated to half its
// dimensions) served by the local embedding server: searches are semantic
// before, during and after the rebuild.
func TestEmbedderChangeBetweenRealModels(t *testing.T) {
	url := embedtest.Start(t)
	before := embed.Config{URL: url, Model: embedtest.Model256, Dimension: 256}
	after := embed.Config{URL: url, Model: embedtest.Model128, Dimension: 128}
	t.Run("embedded", func(t *testing.T) {
		embedderChange{config: embeddedConfig(t), before: before, after: after, semantic: true}.run(t)
	})
	t.Run("qdranttest", func(t *testing.T) {
		embedderChange{config: qdrantConfigOf(modelServer(t)), before: before, after: after, semantic: true}.run(t)
	})
	t.Run("qdrant", func(t *testing.T) {
		srv := realServer(t)
		embedderChange{config: qdrantConfigOf(srv), before: before, after: after, semantic: true}.run(t)
		onlyTheRebuiltCollection(t, srv)
	})
}
