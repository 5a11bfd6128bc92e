//go:build linux

package e2e_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/writer"
)

// collector is an OTLP/HTTP trace receiver: what the exporter sends to
// <endpoint>/v1/traces, decoded.
type collector struct {
	mu    sync.Mutex
	spans []span
}

type span struct {
	trace, id, parent string
	name, scope       string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want protobuf on /v1/traces", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, span{trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), name: s.Name, scope: ss.Scope.GetName()})
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// of returns the spans of trace id.
func (c *collector) of(id string) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if s.trace == id {
			out = append(out, s)
		}
	}
	return out
}

// One document written with a traceparent makes one trace: the writer's
// span (a child of the caller's), the relay's publish (a child of the
// writer's, through the outbox row), and each projector's apply (children
// of the relay's, through the message header), all received by an
// in-process OTLP collector.
func TestOneTraceFromTheWriterToBothProjections(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	ctx := context.Background()
	stopTracing, err := telemetry.StartTracing(ctx, "converge-e2e", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stopTracing(ctx) }()
	if !telemetry.Tracing() {
		t.Fatal("tracing is off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}

	st := stacktest.New(t, pg)
	api, _ := st.StartWriter(t, writer.ServiceConfig{HTTPAddr: "127.0.0.1:0"})
	stacktest.StartRelay(t, relay.ServiceConfig{NATSURL: st.NATS.URL,
		Relay: relay.Config{PostgresURL: st.PostgresURL, StandbyRetry: 100 * time.Millisecond}})
	dir := t.TempDir()
	is, err := embedded.Open(filepath.Join(dir, "index"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	e, err := embed.NewHash(dim)
	if err != nil {
		t.Fatal(err)
	}
	x, err := index.New(ctx, is, e, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := graphembedded.Open(filepath.Join(dir, "graph"), graphembedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	g, err := graph.New(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	st.StartProjector(t, projector.ServiceConfig{Runtime: projector.Config{Name: "index", BatchSize: 16}}, x, nil)
	st.StartProjector(t, projector.ServiceConfig{Runtime: projector.Config{Name: "graph", BatchSize: 16}}, g, nil)

	// The caller's own trace: the writer continues it.
	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("PUT", api+"/v1/documents/traced%2Fdoc", strings.NewReader(`{"version":1,"title":"Traced","body":"one write, one trace","links":["other"]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}

	want := []string{"PUT /v1/documents/{key}", "relay publish", "index apply", "graph apply"}
	deadline := time.Now().Add(30 * time.Second)
	var spans []span
	for {
		spans = col.of(traceID)
		if hasAll(spans, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	byName := map[string]span{}
	for _, s := range spans {
		byName[s.name] = s
	}
	if !hasAll(spans, want) {
		t.Fatalf("trace %s has %v; want the spans %v", traceID, spans, want)
	}
	for name, parent := range map[string]string{
		"PUT /v1/documents/{key}": callerSpan,
		"relay publish":           byName["PUT /v1/documents/{key}"].id,
		"index apply":             byName["relay publish"].id,
		"graph apply":             byName["relay publish"].id,
	} {
		if byName[name].parent != parent {
			t.Errorf("span %q has parent %s, want %s", name, byName[name].parent, parent)
		}
	}
	for name, scope := range map[string]string{"PUT /v1/documents/{key}": "writer", "relay publish": "relay", "index apply": "projector"} {
		if !strings.HasSuffix(byName[name].scope, "/"+scope) {
			t.Errorf("span %q from scope %q, want converge's %s", name, byName[name].scope, scope)
		}
	}
	t.Logf("trace %s: %s", traceID, fmt.Sprint(spans))
}

func hasAll(spans []span, names []string) bool {
	for _, n := range names {
		found := false
		for _, s := range spans {
			found = found || s.name == n
		}
		if !found {
			return false
		}
	}
	return true
}
