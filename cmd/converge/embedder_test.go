package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/embed/embedtest"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// indexOver opens an index over a fresh embedded store with e, holding
// docs (key -> body), and serves its search and info routes.
func indexOver(t *testing.T, dir string, e embed.Embedder, docs map[string]string) (*index.Index, string) {
	t.Helper()
	store, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return indexOn(t, store, filepath.Base(dir), e, docs)
}

// indexOn is indexOver on store, the generation called name.
func indexOn(t *testing.T, store index.Backend, name string, e embed.Embedder, docs map[string]string) (*index.Index, string) {
	t.Helper()
	x, err := index.New(context.Background(), store, e, index.Options{ReadEmbedder: func(id embed.Identity) (embed.Embedder, error) {
		return embed.ForIdentity(embed.Config{}, id)
	}})
	if err != nil {
		t.Fatal(err)
	}
	for key, body := range docs {
		d, err := contract.Document{Key: key, Version: 1, Title: key, Body: body}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		ev := contract.NewUpsertedEvent(d, []string{d.Body})
		if r := x.Apply(context.Background(), []*contract.Event{&ev}); r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+index.SearchPath, index.SearchHandler(x))
	mux.Handle("GET "+index.InfoPath, index.InfoHandler(name, x))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return x, strings.TrimPrefix(srv.URL, "http://")
}

// converge search over an index embedded with a real (small) sentence
// model: queries that share no word with the document they mean find it.
func TestSearchIsSemanticWithALocalModel(t *testing.T) {
	url := embedtest.Start(t)
	e, err := embed.New(embed.Config{URL: url, Model: embedtest.Model256, Dimension: 256})
	if err != nil {
		t.Fatal(err)
	}
	_, addr := indexOver(t, t.TempDir(), e, embedtest.Corpus)
	for query, want := range embedtest.Queries {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"search", "--json", "-k", "3", "-index-addr", addr, query}, &out); err != nil {
			t.Fatal(err)
		}
		var res index.SearchResponse
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		if len(res.Results) == 0 || res.Results[0].Key != want {
			t.Errorf("converge search %q: %+v; want %q first", query, res.Results, want)
		}
	}
	// The hash embedder, which matches words, finds them first only by
	// chance: the queries share no word with the documents.
	h, _ := embed.NewHash(256)
	var hashHits int
	_, haddr := indexOver(t, t.TempDir(), h, embedtest.Corpus)
	for query, want := range embedtest.Queries {
		res, err := (&index.Client{Addr: haddr}).Search(context.Background(), query, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Results) > 0 && res.Results[0].Key == want && res.Results[0].Score > 0.05 {
			hashHits++
		}
	}
	if hashHits == len(embedtest.Queries) {
		t.Errorf("the lexical hash embedder found every document: the queries do not test meaning")
	}
}

// converge status names the embedder of the index's live generation, and
// says when the projector refuses to write it and what to do: on the
// embedded index and on Qdrant collections.
func TestStatusShowsTheIndexEmbedder(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		testStatusShowsTheIndexEmbedder(t, func(t *testing.T) index.Backend {
			store, err := embedded.Open(t.TempDir(), embedded.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			return store
		})
	})
	t.Run("qdrant", func(t *testing.T) {
		q := testenv.LeaseQdrant(t)
		n := 0
		testStatusShowsTheIndexEmbedder(t, func(t *testing.T) index.Backend {
			n++ // a collection each, all of them named after the lease
			store, err := qdrant.New(context.Background(), qdrant.Config{Addr: q.URL, APIKey: q.APIKey, Collection: fmt.Sprintf("%s_%d", q.Collection, n)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			return store
		})
	})
}

// testStatusShowsTheIndexEmbedder is TestStatusShowsTheIndexEmbedder on
// the fresh stores that open returns.
func testStatusShowsTheIndexEmbedder(t *testing.T, open func(t *testing.T) index.Backend) {
	ctx := context.Background()
	url := pg.MigratedDatabase(t)
	h64, _ := embed.NewHash(64)
	_, addr := indexOn(t, open(t), "index", h64, map[string]string{"a": "some text"})

	var out bytes.Buffer
	if err := run(ctx, []string{"status", "-postgres-url", url, "-index-addr", addr}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `hash model "converge.hash.v1/64", 64 dimensions`) || strings.Contains(out.String(), "WRITES REFUSED") {
		t.Fatalf("status output lacks the embedder:\n%s", out.String())
	}

	// A store of h64 under a projector configured with another embedder.
	h32, _ := embed.NewHash(32)
	store := open(t)
	if err := store.Ensure(ctx, 64); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordEmbedder(ctx, embed.IdentityOf(h64)); err != nil {
		t.Fatal(err)
	}
	x, err := index.New(ctx, store, h32, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(index.InfoHandler("index", x))
	defer srv.Close()
	out.Reset()
	if err := run(ctx, []string{"status", "-postgres-url", url, "-index-addr", strings.TrimPrefix(srv.URL, "http://"), "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Index == nil || rep.Index.Info == nil || rep.Index.Embedder != embed.IdentityOf(h64) || rep.Index.Configured != embed.IdentityOf(h32) ||
		!strings.Contains(rep.Index.WritesRefused, "converge rebuild index") || rep.Index.SearchError == "" {
		t.Fatalf("status --json index: %+v", rep.Index)
	}
	out.Reset()
	if err := run(ctx, []string{"status", "-postgres-url", url, "-index-addr", strings.TrimPrefix(srv.URL, "http://")}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WRITES REFUSED", `hash model "converge.hash.v1/32", 32 dimensions`, "converge rebuild index", "SEARCHES FAIL"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status output lacks %q:\n%s", want, out.String())
		}
	}
	// No projector at the address: reported, not an error.
	out.Reset()
	if err := run(ctx, []string{"status", "-postgres-url", url, "-index-addr", "127.0.0.1:1"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "not known") {
		t.Fatalf("status without an index projector:\n%s", out.String())
	}
}

// converge verify's report names the embedder of the index's live
// generation under its verdict.
func TestVerifyPrintsTheIndexEmbedder(t *testing.T) {
	id := embed.Identity{Kind: embed.KindHash, Model: "converge.hash.v1/256", Dimension: 256}
	var out bytes.Buffer
	printVerify(&out, verify.Result{Stores: []verify.Report{
		{Store: "index", Kind: verify.Index, Buckets: 4, Documents: 3, StoreDocuments: 3, Agrees: true, Embedder: &id},
		{Store: "graph", Kind: verify.Graph, Buckets: 4, Documents: 3, StoreDocuments: 3, Agrees: true},
	}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "index  agrees") ||
		!strings.Contains(lines[1], `live generation's vectors: embedder hash model "converge.hash.v1/256", 256 dimensions`) ||
		!strings.HasPrefix(lines[2], "graph  agrees") {
		t.Fatalf("verify output:\n%s", out.String())
	}
}
