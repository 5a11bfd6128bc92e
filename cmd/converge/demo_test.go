package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
)

// runDemo runs converge demo with args and returns its output; the test
// fails if the demo does.
func runDemo(t *testing.T, args ...string) *bytes.Buffer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := demo(ctx, args, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	return &out
}

// The demo runs end to end on embedded defaults (a small corpus): load,
// redelivery, a SIGKILLed graph projector, search, graph query, verify.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes a while")
	}
	out := runDemo(t, "-docs", "60")
	for _, want := range []string{
		"convergence report",
		"index   AGREES with Postgres", "graph   AGREES with Postgres",
		"projector kills (SIGKILL)               1",
		"rebuild index: blue/green into index-",
		"wiki/volcanoes/",
		"document wiki/volcanoes/000: version",
		"source products: shop.products mapped by view shop.converge_source_products; 40 rows handed over",
		"product/7", "document product/7: version 2", "product/8, its row deleted: withdrawn true",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "events redelivered, skipped as applied  0") {
		t.Error("the redelivery step redelivered nothing")
	}
}

// With CONVERGE_NEO4J_URL set (as `make demo-neo4j` sets it), the demo
// runs with the graph in Neo4j, the real test server here, and ends with
// verify agreeing.
func TestDemoOnNeo4j(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes a while")
	}
	n := testenv.LeaseNeo4j(t)
	t.Setenv("CONVERGE_NEO4J_URL", n.URL)
	t.Setenv("CONVERGE_NEO4J_USER", n.User)
	t.Setenv("CONVERGE_NEO4J_PASSWORD", n.Password)
	out := runDemo(t, "-docs", "60")
	flat := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"the graph projector into Neo4j at " + n.URL,
		"graph AGREES with Postgres", "index AGREES with Postgres"} {
		if !strings.Contains(flat, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), n.Password) {
		t.Error("the demo's output shows the Neo4j password")
	}
	// The graph the demo verified is in Neo4j, not in an embedded store.
	ctx := context.Background()
	b, err := neo4j.New(ctx, neo4j.Config{URL: n.URL, User: n.User, Password: n.Password})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	docs := 0
	if err := b.ScanDocuments(ctx, func(v graph.View) error {
		if !v.Stub {
			docs++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if docs < 60 {
		t.Errorf("Neo4j holds %d written documents after the demo; want at least its 60", docs)
	}
}

// The graph projector child whose picked address another process took
// before it could bind is started again on a fresh one.
func TestGraphChildTakesAnotherAddressWhenItsOwnIsTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	f := config.NewFlags("test")
	flags := devFlags(f, stack.Config{})
	if err := f.Parse([]string{"-log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := flags()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr} {
		if *a, err = stack.FreeAddr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg.GraphAddr, cfg.GraphAddrPicked, cfg.GraphChild = taken.Addr().String(), true, true
	cfg.LogOut = io.Discard
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop() }()
	if s.GraphAddr == taken.Addr().String() || !stack.HTTPOK("http://"+s.GraphAddr+"/readyz") {
		t.Fatalf("graph projector at %s (the taken address is %s)", s.GraphAddr, taken.Addr())
	}
}
