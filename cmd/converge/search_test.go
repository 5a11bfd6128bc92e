package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/pkg/contract"
)

func TestSearchAsksTheIndexProjector(t *testing.T) {
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, _ := embed.NewHash(32)
	x, err := index.New(context.Background(), store, e, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := contract.Document{Key: "guide/rivers", Version: 3, Title: "Rivers", Body: "Rivers carry water from mountains to the sea."}.Normalize()
	ev := contract.NewUpsertedEvent(d, []string{d.Body})
	if r := x.Apply(context.Background(), []*contract.Event{&ev}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	srv := httptest.NewServer(index.SearchHandler(x))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out bytes.Buffer
	// Flags after the query, and a query in several words.
	if err := run(context.Background(), []string{"search", "water", "in", "rivers", "-k", "3", "-index-addr", addr}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "guide/rivers") || !strings.Contains(out.String(), "Rivers carry water") {
		t.Fatalf("output:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"search", "--json", "-index-addr", addr, "rivers"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), `{"results":[{"key":"guide/rivers"`) {
		t.Fatalf("json output: %s", out.String())
	}
	if err := run(context.Background(), []string{"search", "-index-addr", addr}, &out); err == nil || !strings.Contains(err.Error(), "needs a query") {
		t.Fatalf("search without a query: %v", err)
	}
	if err := run(context.Background(), []string{"search", "x", "-index-addr", "127.0.0.1:1"}, &out); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("search with no projector: %v", err)
	}
}
