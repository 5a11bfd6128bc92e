package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/verify"
)

// putDoc writes key at version through the writer's API.
func putDoc(ctx context.Context, s *stack.Stack, key string, version int) error {
	para := strings.Repeat(fmt.Sprintf("Paragraph about %s at version %d, with enough words to fill a chunk. ", key, version), 12)
	body := fmt.Sprintf(`{"version":%d,"title":"Doc %s","body":%q,"links":["doc-00"],"tags":["t%d"]}`, version, key, para+"\n\n"+para, version%3)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.APIURL+"/v1/documents/"+key, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	auth.SetBearer(req.Header, s.WriterToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT %s: %s", key, resp.Status)
	}
	return nil
}

// converge verify -watch --repair on the dev stack: every bucket of both
// stores is proven in agreement; documents written while the graph
// projector is down are not named missing from it (its steps wait for it);
// two documents damaged in the graph behind its projector's back while
// other documents keep being rewritten are named, with their keys and
// problems, re-emitted and repaired, and both stores proven in agreement
// again while the rewrites go on; and no write in flight is ever named.
func TestVerifyWatchNamesAndRepairsADamagedStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dbURL := devDatabase(t)
	cfg := devConfig(t, dbURL)
	var metricsAddr string
	freeAddrs(t, &metricsAddr)
	cfg.GraphChild = true
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	t.Setenv(auth.EnvToken+"_FILE", s.OperatorTokenFile)
	t.Setenv(natsauth.EnvPassword+"_FILE", s.OperatorNATSPasswordFile)
	for i := range 20 {
		if err := putDoc(ctx, s, fmt.Sprintf("doc-%02d", i), 1); err != nil {
			t.Fatal(err)
		}
	}

	wctx, stopWatch := context.WithCancel(ctx)
	var logs lockedBuffer
	watched := make(chan error, 1)
	go func() {
		watched <- run(wctx, []string{"verify", "-watch", "--repair", "-postgres-url", dbURL, "-index-addr", cfg.IndexAddr, "-graph-addr", cfg.GraphAddr,
			"-nats-url", s.NATSURL, "-nats-user", natsauth.UserOperator, "-writer-url", s.APIURL, "-metrics-addr", metricsAddr,
			"-buckets", "64", "-watch-step", "32", "-watch-pass", "1s", "-watch-wait", "3s"}, &logs)
	}()
	defer func() {
		stopWatch()
		if err := <-watched; err != nil {
			t.Errorf("verify -watch ended with %v", err)
		}
	}()
	status := func() (verify.WatchStatus, bool) {
		var st verify.WatchStatus
		resp, err := http.Get("http://" + metricsAddr + "/v1/verify/status")
		if err != nil {
			return st, false
		}
		defer resp.Body.Close()
		return st, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil
	}
	proven := func(store string, docs int) bool {
		st, ok := status()
		if !ok {
			return false
		}
		for _, p := range st.Stores {
			if p.Store == store {
				return p.ProvenFraction == 1 && p.LastFullPass != nil && len(p.Differences) == 0 && p.ProvenDocuments == docs
			}
		}
		return false
	}
	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { return proven("index", 20) && proven("graph", 20) }); err != nil {
		st, _ := status()
		t.Fatalf("the stores were not proven in agreement: %v; status %+v\n%s", err, st, logs.String())
	}

	scrape := func(name string, labels telemetry.Labels) float64 {
		m, err := telemetry.Scrape(ctx, "http://"+metricsAddr+"/metrics")
		if err != nil {
			return -1
		}
		v, err := m.Value(name, labels)
		if err != nil {
			return -1
		}
		return v
	}
	graphLabels := telemetry.Labels{"store": "graph"}

	// A projection behind: five documents written while the graph
	// projector is down are in the index, proven there, and never named
	// missing from the graph, whose steps wait for it instead.
	if err := s.KillGraphChild(); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 25; i++ {
		if err := putDoc(ctx, s, fmt.Sprintf("doc-%02d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { return proven("index", 25) }); err != nil {
		st, _ := status()
		t.Fatalf("the index was not proven with the new documents: %v; status %+v\n%s", err, st, logs.String())
	}
	if n := scrape("converge_verify_differences_named_total", graphLabels); n != 0 {
		t.Fatalf("%v differences named in a graph whose projector was down: documents not applied yet taken for differences\n%s", n, logs.String())
	}
	if n := scrape("converge_verify_projection_behind_total", graphLabels); n < 1 {
		t.Errorf("no step waited for the graph projector that was down (%v)", n)
	}
	if err := s.StartGraphChild(ctx); err != nil {
		t.Fatal(err)
	}

	// Writes in flight all along: documents 10 to 19 rewritten again and
	// again.
	wrote := make(chan error, 1)
	writesCtx, stopWrites := context.WithCancel(ctx)
	go func() {
		for v := 2; ; v++ {
			for i := 10; i < 20; i++ {
				if writesCtx.Err() != nil {
					wrote <- nil
					return
				}
				if err := putDoc(writesCtx, s, fmt.Sprintf("doc-%02d", i), v); err != nil && writesCtx.Err() == nil {
					wrote <- err
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()

	g3, g7 := graphView(t, s, "doc-03"), graphView(t, s, "doc-07")
	if len(g3.Chunks) < 2 {
		t.Fatalf("doc-03 has %d chunks: the test needs several", len(g3.Chunks))
	}
	g3.Chunks, g7.Links = g3.Chunks[:1], []string{"nowhere"}
	g3.Repair, g7.Repair = true, true
	damageGraph(t, s, g3, g7)
	damaged := time.Now()

	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool {
		return scrape("converge_verify_differences_named_total", graphLabels) >= 2
	}); err != nil {
		t.Fatalf("the damage was not named: %v\n%s", err, logs.String())
	}
	t.Logf("the damage was named %s after it was made", time.Since(damaged).Round(10*time.Millisecond))
	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool {
		return scrape("converge_verify_repairs_total", telemetry.Labels{"store": "graph", "outcome": "repaired"}) == 2
	}); err != nil {
		st, _ := status()
		t.Fatalf("the damage was not repaired: %v; status %+v\n%s", err, st, logs.String())
	}
	t.Logf("the damage was repaired %s after it was made", time.Since(damaged).Round(10*time.Millisecond))
	// Proven whole while documents are still being rewritten: a store
	// ahead of Postgres's read holds what Postgres holds when asked again.
	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { return proven("index", 25) && proven("graph", 25) }); err != nil {
		st, _ := status()
		t.Fatalf("the stores were not proven in agreement after the repair: %v; status %+v\n%s", err, st, logs.String())
	}
	stopWrites()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}

	// Named: exactly the two documents damaged, each with its problem,
	// in the graph; nothing in the index, whatever was in flight.
	type named struct{ Store, Key, Problem string }
	var got []named
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var l struct {
			Msg, Store, Key, Problem string
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "difference:") {
			got = append(got, named{l.Store, l.Key, l.Problem})
		}
	}
	want := []named{{"graph", "doc-03", verify.StaleChunks}, {"graph", "doc-07", verify.LinksMismatch}}
	slices.SortFunc(got, func(a, b named) int { return strings.Compare(a.Key, b.Key) })
	if !slices.Equal(got, want) {
		t.Errorf("named %+v, want %+v\n%s", got, want, logs.String())
	}
	if n := scrape("converge_verify_differences_named_total", telemetry.Labels{"store": "index"}); n != 0 {
		t.Errorf("the index had %v differences named: a write in flight taken for one", n)
	}
	if n := scrape("converge_verify_repairs_total", telemetry.Labels{"store": "graph", "outcome": "reemitted"}); n != 2 {
		t.Errorf("%v re-emissions, want 2", n)
	}
	if !strings.Contains(logs.String(), `"msg":"repaired`) {
		t.Errorf("the log does not say the repairs:\n%s", logs.String())
	}
}

// converge verify -watch refuses, before it connects to anything, what
// cannot work: no NATS to read the projections' progress from, a status
// naming documents' keys served beyond loopback, a step of no bucket, and
// --json, which a run that never ends cannot print.
func TestVerifyWatchRefusesWhatCannotWork(t *testing.T) {
	t.Setenv(config.EnvNATSURL, "")
	const pgURL = "postgres://converge@127.0.0.1:1/converge?connect_timeout=1"
	for _, tc := range []struct {
		args []string
		want string
		exit int
	}{
		{[]string{"-json"}, "-watch reports on /v1/verify/status", 2},
		{[]string{}, "-nats-url (or CONVERGE_NATS_URL) is required", 1},
		{[]string{"-nats-url", "nats://127.0.0.1:1", "-metrics-addr", "0.0.0.0:9106"}, "serve it on loopback", 2},
		{[]string{"-nats-url", "nats://127.0.0.1:1", "-watch-step", "0"}, "-watch-step from 1 to -buckets (1024)", 2},
		{[]string{"-nats-url", "nats://127.0.0.1:1", "-watch-pass", "0s"}, "-watch-pass and -watch-wait must be positive", 2},
	} {
		args := append([]string{"verify", "-watch", "-postgres-url", pgURL}, tc.args...)
		err := run(context.Background(), args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || service.ExitCode("converge", err, io.Discard) != tc.exit {
			t.Errorf("%v: %v (exit %d), want exit %d and %q", args, err, service.ExitCode("converge", err, io.Discard), tc.exit, tc.want)
		}
	}
}
