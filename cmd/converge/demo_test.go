package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
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
