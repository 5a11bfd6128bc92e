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

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
)

// lockedSide is a verify side in memory that the fake writer below
// repairs while verify reads it.
type lockedSide struct {
	mu   sync.Mutex
	name string
	docs map[string]verify.Doc
}

func (s *lockedSide) memory() *verify.Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &verify.Memory{Label: s.name}
	for _, d := range s.docs {
		m.Docs = append(m.Docs, d)
	}
	return m
}

func (s *lockedSide) Name() string { return s.name }

func (s *lockedSide) Digests(ctx context.Context, kind verify.Kind, n int) ([]verify.BucketDigest, error) {
	return s.memory().Digests(ctx, kind, n)
}

func (s *lockedSide) Buckets(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, error) {
	return s.memory().Buckets(ctx, kind, n, buckets)
}

func vdoc(key string, version int64, hash string, chunks int, links ...string) verify.Doc {
	d := verify.Doc{Key: key, Version: version, ContentHash: hash, Links: links}
	for i := range chunks {
		d.Chunks = append(d.Chunks, verify.Chunk{ID: uuid.NewSHA1(uuid.NameSpaceURL, []byte(key+string(rune('0'+i)))), Hash: hash})
	}
	return d
}

// fakeWriter answers re-emission requests; with repairs, it copies the
// re-emitted documents from the truth into the stores, a little later, as
// the projectors would, except where repairs says a store keeps its own.
func fakeWriter(t *testing.T, truth map[string]verify.Doc, stores []*lockedSide, repairs func(store, key string) bool, asked *[]string) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req writer.ReemitRequest
		if r.URL.Path != "/v1/admin/reemit" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		*asked = append(*asked, req.Keys...)
		mu.Unlock()
		resp := writer.ReemitResponse{Reemitted: []writer.ReemittedDocument{}, NotFound: []string{}}
		for i, k := range req.Keys {
			d, ok := truth[k]
			if !ok {
				resp.NotFound = append(resp.NotFound, k)
				continue
			}
			resp.Reemitted = append(resp.Reemitted, writer.ReemittedDocument{Key: k, Version: d.Version, Emission: int64(i + 1)})
		}
		if repairs != nil {
			time.AfterFunc(50*time.Millisecond, func() {
				for _, s := range stores {
					s.mu.Lock()
					for _, k := range req.Keys {
						if d, ok := truth[k]; ok && repairs(s.name, k) {
							s.docs[k] = d
						}
					}
					s.mu.Unlock()
				}
			})
		}
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
	truth := map[string]verify.Doc{}
	for _, d := range []verify.Doc{vdoc("a", 2, "ha2", 2), vdoc("b", 1, "hb", 3), vdoc("c", 1, "hc", 1, "a"), vdoc("d", 4, "hd", 1), vdoc("e", 1, "he", 1)} {
		truth[d.Key] = d
	}
	index := &lockedSide{name: "index", docs: map[string]verify.Doc{
		"a": vdoc("a", 1, "ha1", 2),                                                  // stale_version
		"b": vdoc("b", 1, "hb", 1),                                                   // stale_chunks
		"c": {Key: "c", Version: 1, ContentHash: "other", Chunks: truth["c"].Chunks}, // content_mismatch: the index's marker
		"d": vdoc("d", 5, "hd5", 1),                                                  // version_mismatch
		"x": vdoc("x", 1, "hx", 1),                                                   // extra
		// e is missing.
	}}
	graph := &lockedSide{name: "graph", docs: map[string]verify.Doc{
		"a": truth["a"], "b": truth["b"], "d": truth["d"], "e": truth["e"],
		"c": {Key: "c", Version: 1, ContentHash: "hc", Chunks: truth["c"].Chunks}, // links_mismatch
	}}
	truthSide := &lockedSide{name: "postgres", docs: truth}
	stores := []namedSide{{verify.Index, index}, {verify.Graph, graph}}
	var asked []string
	// A re-emission leaves the index's marker of c as it is.
	wsrv := fakeWriter(t, truth, []*lockedSide{index, graph}, func(store, key string) bool { return store != "index" || key != "c" }, &asked)
	wc, err := newWriterClient(wsrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	first, err := runVerify(ctx, truthSide, stores, 64, false)
	if err != nil || first.Agrees {
		t.Fatalf("first verify: agrees %v, %v", first.Agrees, err)
	}
	var out bytes.Buffer
	rep, err := verify.Repair(ctx, hintedWriter{wc}, truthSide, projections(stores), first, verify.RepairConfig{Buckets: 64, Timeout: 10 * time.Second,
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
	truth := map[string]verify.Doc{"a": vdoc("a", 2, "h2", 1)}
	index := &lockedSide{name: "index", docs: map[string]verify.Doc{"a": vdoc("a", 1, "h1", 1)}}
	stores := []namedSide{{verify.Index, index}}
	truthSide := &lockedSide{name: "postgres", docs: truth}
	var asked []string
	wc, err := newWriterClient(fakeWriter(t, truth, nil, nil, &asked).URL)
	if err != nil {
		t.Fatal(err)
	}
	first, err := runVerify(ctx, truthSide, stores, 16, false)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := verify.Repair(ctx, hintedWriter{wc}, truthSide, projections(stores), first, verify.RepairConfig{Buckets: 16, Timeout: 300 * time.Millisecond,
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
	truthSide := &lockedSide{name: "postgres", docs: map[string]verify.Doc{"a": vdoc("a", 1, "h", 1)}}
	stores := []namedSide{{verify.Index, &lockedSide{name: "index", docs: map[string]verify.Doc{}}}}
	first, err := runVerify(context.Background(), truthSide, stores, 16, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = verify.Repair(context.Background(), hintedWriter{wc}, truthSide, projections(stores), first, verify.RepairConfig{Buckets: 16, Timeout: time.Second})
	if err == nil || !strings.HasPrefix(err.Error(), "repair: ") || !strings.Contains(err.Error(), "(is the writer running? -writer-url, env "+envWriterURL+")") {
		t.Fatalf("repair with the writer down: %v", err)
	}
}
