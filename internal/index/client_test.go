package index_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/pkg/contract"
)

func TestClientSearch(t *testing.T) {
	ctx := context.Background()
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, err := embed.NewHash(64)
	if err != nil {
		t.Fatal(err)
	}
	x, err := index.New(ctx, store, e, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := contract.Document{Key: "guide/rivers", Version: 3, Title: "Rivers", Tags: []string{"water"}, Body: "Rivers carry water from mountains to the sea."}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	ev := contract.NewUpsertedEvent(d, []string{d.Body})
	if r := x.Apply(ctx, []*contract.Event{&ev}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+index.SearchPath, index.SearchHandler(x))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := &index.Client{Addr: strings.TrimPrefix(srv.URL, "http://")}

	// A query with characters that need escaping.
	res, err := c.Search(ctx, "water & rivers?", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 1 {
		t.Fatalf("results %+v", res.Results)
	}
	r := res.Results[0]
	if r.Key != "guide/rivers" || r.Version != 3 || r.Ordinal != 0 || r.ChunkID != ev.Chunks[0].ID.String() || r.Title != "Rivers" ||
		len(r.Tags) != 1 || r.Tags[0] != "water" || r.Score <= 0 || r.Text != d.Body {
		t.Fatalf("result %+v", r)
	}

	for _, tc := range []struct {
		query string
		k     int
		code  string
	}{
		{"", 3, "missing_query"},
		{"water", 0, "invalid_k"},
		{"water", index.MaxSearchK + 1, "invalid_k"},
	} {
		_, err := c.Search(ctx, tc.query, tc.k)
		var apiErr *index.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != tc.code || apiErr.Message == "" ||
			!strings.Contains(err.Error(), "400") {
			t.Errorf("search %q k %d: %v, want a 400 %s", tc.query, tc.k, err, tc.code)
		}
	}
	if _, err := (&index.Client{Addr: "127.0.0.1:1"}).Search(ctx, "x", 1); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("search with no projector: %v", err)
	}
}
