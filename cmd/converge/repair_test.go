package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/verifytest"
	"github.com/converge-sync/converge/internal/writer"
)

// fakeWriter serves the writer's re-emission API over r, recording the
// keys asked for in asked.
func fakeWriter(t *testing.T, r *verifytest.Reemitter, asked *[]string) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body writer.ReemitRequest
		if req.URL.Path != writer.ReemitPath || json.NewDecoder(req.Body).Decode(&body) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		*asked = append(*asked, body.Keys...)
		mu.Unlock()
		resp, _ := r.ReemitKeys(req.Context(), body.Keys)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// verify --repair, through the writer's client, says which differences it
// cannot repair, what it re-emits and how long it waits, then sums up what
// it repaired. (The protocol itself is verify.Repair's, tested there.)
func TestRepairOutput(t *testing.T) {
	ctx := context.Background()
	truth, index, graph := verifytest.EveryDifference()
	truthSide := verifytest.NewSide("postgres", truth)
	stores := []verify.Projection{{Kind: verify.Index, Side: index}, {Kind: verify.Graph, Side: graph}}
	var asked []string
	// A re-emission leaves the index's marker of c as it is.
	wsrv := fakeWriter(t, &verifytest.Reemitter{Truth: truth, Stores: []*verifytest.Side{index, graph}, Repairs: func(store, key string) bool { return store != "index" || key != "c" }}, &asked)
	wc, err := newWriterClient(wsrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	first, err := runVerify(ctx, truthSide, stores, 64, false)
	if err != nil || first.Agrees {
		t.Fatalf("first verify: agrees %v, %v", first.Agrees, err)
	}
	var out bytes.Buffer
	rep, err := verify.Repair(ctx, hintedWriter{wc}, truthSide, stores, first, verify.RepairConfig{Buckets: 64, Timeout: 10 * time.Second,
		Interval: 10 * time.Millisecond, Progress: printRepairProgress(&out, wc.URL(), 10*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	if !slices.Equal(asked, []string{"a", "b", "c", "e"}) {
		t.Fatalf("re-emitted %v, want [a b c e]: c for the graph's links, not for the index's marker", asked)
	}
	rr := rep.Repair
	if rr == nil || len(rr.Reemitted) != 4 {
		t.Fatalf("repair report %+v", rr)
	}
	items := func(list []verify.RepairItem) []string {
		var s []string
		for _, d := range list {
			s = append(s, d.Store+" "+d.Problem+" "+d.Key)
		}
		slices.Sort(s)
		return s
	}
	if got, want := items(rr.Repaired), []string{"graph links_mismatch c", "index missing e", "index stale_chunks b", "index stale_version a"}; !slices.Equal(got, want) {
		t.Fatalf("repaired %v, want %v", got, want)
	}
	if got, want := items(rr.Unrepairable), []string{"index content_mismatch c", "index extra x", "index version_mismatch d"}; !slices.Equal(got, want) {
		t.Fatalf("unrepairable %v, want %v", got, want)
	}
	if got := items(rr.Remaining); !slices.Equal(got, items(rr.Unrepairable)) {
		t.Fatalf("remaining %v, want the unrepairable ones", got)
	}
	if rep.Agrees {
		t.Fatal("the stores agree although the index holds an extra document")
	}
	for _, want := range []string{"repair: cannot repair index extra x by re-emission: the store holds a document Postgres does not have",
		"repair: re-emitting 4 documents through the writer at " + wsrv.URL + "\n",
		"repair: re-emitted 4 documents; waiting up to 10s for the stores to agree\n", "repair: verified again "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printRepaired(&out, rr)
	if !strings.Contains(out.String(), "repaired 4 differences") || !strings.Contains(out.String(), "3 differences cannot be repaired") {
		t.Errorf("summary:\n%s", out.String())
	}
}

// When the stores do not converge in time, --repair says which documents
// were not repaired.
func TestRepairOutputWhenTimedOut(t *testing.T) {
	ctx := context.Background()
	truth := map[string]verify.Doc{"a": verifytest.Doc("a", 2, "h2", 1)}
	index := verifytest.NewSide("index", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h1", 1)})
	stores := []verify.Projection{{Kind: verify.Index, Side: index}}
	truthSide := verifytest.NewSide("postgres", truth)
	var asked []string
	wc, err := newWriterClient(fakeWriter(t, &verifytest.Reemitter{Truth: truth}, &asked).URL)
	if err != nil {
		t.Fatal(err)
	}
	first, err := runVerify(ctx, truthSide, stores, 16, false)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := verify.Repair(ctx, hintedWriter{wc}, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: 300 * time.Millisecond,
		Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Agrees || len(rep.Repair.Repaired) != 0 || len(rep.Repair.Remaining) != 1 {
		t.Fatalf("after the timeout: agrees %v, report %+v", rep.Agrees, rep.Repair)
	}
	var out bytes.Buffer
	printRepaired(&out, rep.Repair)
	if !strings.Contains(out.String(), "not repaired after waiting") || !strings.Contains(out.String(), "index stale_version a") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

// A writer that does not answer is named with the flag that says where it
// was looked for.
func TestRepairNamesTheWriterThatDoesNotAnswer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	wc, err := newWriterClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	truthSide := verifytest.NewSide("postgres", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h", 1)})
	stores := []verify.Projection{{Kind: verify.Index, Side: verifytest.NewSide("index", map[string]verify.Doc{})}}
	first, err := runVerify(context.Background(), truthSide, stores, 16, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = verify.Repair(context.Background(), hintedWriter{wc}, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: time.Second})
	if err == nil || !strings.HasPrefix(err.Error(), "repair: ") || !strings.Contains(err.Error(), "(is the writer running? -writer-url, env "+envWriterURL+")") {
		t.Fatalf("repair with the writer down: %v", err)
	}
}
