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
)

// The demo runs end to end on embedded defaults (a small corpus): load,
// redelivery, a SIGKILLed graph projector, search, graph query, verify.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes a while")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := demo(ctx, []string{"-docs", "60"}, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"convergence report",
		"index   AGREES with Postgres", "graph   AGREES with Postgres",
		"projector kills (SIGKILL)               1",
		"rebuild index: blue/green into index-",
		"wiki/volcanoes/",
		"document wiki/volcanoes/000: version",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "events redelivered, skipped as applied  0") {
		t.Error("the redelivery step redelivered nothing")
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
	flags := devFlags(f, devConfig{})
	if err := f.Parse([]string{"-log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := flags()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*string{&cfg.httpAddr, &cfg.writerAddr, &cfg.relayAddr, &cfg.indexAddr} {
		if *a, err = freeAddr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg.graphAddr, cfg.graphAddrPicked, cfg.graphChild = taken.Addr().String(), true, true
	cfg.logOut = io.Discard
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := startDev(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.stop() }()
	if s.cfg.graphAddr == taken.Addr().String() || !httpOK("http://"+s.cfg.graphAddr+"/readyz") {
		t.Fatalf("graph projector at %s (the taken address is %s)", s.cfg.graphAddr, taken.Addr())
	}
}
