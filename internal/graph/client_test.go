package graph_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
)

func TestClientDocument(t *testing.T) {
	ctx := context.Background()
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	chunk := uuid.NewSHA1(uuid.NameSpaceURL, []byte("chunk"))
	// A key that needs escaping, and slashes that stay in the path.
	const odd = "guide/a b?#%"
	if _, err := store.Apply(ctx, []graph.Doc{
		{Key: odd, Version: 2, Title: "A", ContentHash: "h", Links: []string{"guide/b"}, Tags: []string{"t"},
			Chunks: []graph.Chunk{{ID: chunk, Ordinal: 0, ContentHash: "hc"}}},
		{Key: "guide/c", Version: 1, Title: "C", ContentHash: "h2", Links: []string{odd}},
	}); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+graph.DocumentPath+"{key...}", graph.DocumentHandler(store))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := &graph.Client{Addr: strings.TrimPrefix(srv.URL, "http://")}

	d, err := c.Document(ctx, odd)
	if err != nil {
		t.Fatal(err)
	}
	if d.Key != odd || d.Stub || d.Version != 2 || d.Title != "A" || d.ContentHash != "h" || len(d.Chunks) != 1 || d.Chunks[0].ID != chunk.String() ||
		d.Chunks[0].ContentHash != "hc" || strings.Join(d.LinksOut, ",") != "guide/b" || strings.Join(d.LinksIn, ",") != "guide/c" || strings.Join(d.Tags, ",") != "t" {
		t.Fatalf("document %+v", d)
	}
	if d, err := c.Document(ctx, "guide/b"); err != nil || !d.Stub {
		t.Fatalf("a stub: %+v, %v", d, err)
	}
	// Keys a path would be cleaned of: read as they are, not redirected
	// to another document's path.
	for _, key := range []string{"dir/../guide/c", "guide//c", "./guide/c", "guide/c/", ".", ".."} {
		if _, err := store.Apply(ctx, []graph.Doc{{Key: key, Version: 4, Title: key, ContentHash: "h4"}}); err != nil {
			t.Fatal(err)
		}
		if d, err := c.Document(ctx, key); err != nil || d.Key != key || d.Version != 4 {
			t.Errorf("key %q: %+v, %v", key, d, err)
		}
	}

	_, err = c.Document(ctx, "nobody")
	var apiErr *graph.APIError
	if !errors.Is(err, graph.ErrNoDocument) || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "not_found" ||
		!strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown key: %v", err)
	}
	_, err = c.Document(ctx, "")
	if !errors.As(err, &apiErr) || errors.Is(err, graph.ErrNoDocument) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := (&graph.Client{Addr: "127.0.0.1:1"}).Document(ctx, "x"); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("no projector: %v", err)
	}
}
