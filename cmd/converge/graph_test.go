package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
)

func TestGraphAsksTheGraphProjector(t *testing.T) {
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	if _, err := store.Apply(ctx, []graph.Doc{
		{Key: "guide/a", Version: 2, Title: "A", ContentHash: "h", Links: []string{"guide/b"}, Tags: []string{"t"}},
		{Key: "guide/c", Version: 1, Title: "C", ContentHash: "h2", Links: []string{"guide/a"}},
	}); err != nil {
		t.Fatal(err)
	}
	mux := httptestMux(store)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out bytes.Buffer
	if err := run(ctx, []string{"graph", "guide/a", "-graph-addr", addr}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"document guide/a: version 2", "links out: guide/b", "links in:  guide/c", "tags:      t"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(ctx, []string{"graph", "-graph-addr", addr, "guide/b"}, &out); err != nil || !strings.Contains(out.String(), "stub") {
		t.Fatalf("a stub: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"graph", "--json", "-graph-addr", addr, "guide/a"}, &out); err != nil || !strings.HasPrefix(out.String(), `{"key":"guide/a"`) {
		t.Fatalf("json: %v %s", err, out.String())
	}
	if err := run(ctx, []string{"graph", "-graph-addr", addr, "nobody"}, &out); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown key: %v", err)
	}
	if err := run(ctx, []string{"graph", "-graph-addr", addr}, &out); err == nil || !strings.Contains(err.Error(), "one document key") {
		t.Fatalf("no key: %v", err)
	}
}

func httptestMux(b graph.Backend) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /v1/graph/{key...}", graph.DocumentHandler(b))
	return mux
}

func TestReplayRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "-nats-url", "nats://127.0.0.1:1", "index"},
		{"replay", "-nats-url", "nats://127.0.0.1:1", "--from-seq", "1", "--from-time", "2026-01-01T00:00:00Z", "index"},
		{"replay", "-nats-url", "nats://127.0.0.1:1", "--from-seq", "1"},
		{"replay", "-nats-url", "nats://127.0.0.1:1", "--from-time", "yesterday", "index"},
	} {
		if err := run(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v was accepted", args)
		}
	}
}
