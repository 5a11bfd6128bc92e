package verify_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/verifytest"
)

func items(list []verify.RepairItem) []string {
	var s []string
	for _, d := range list {
		s = append(s, d.Store+" "+d.Problem+" "+d.Key)
	}
	slices.Sort(s)
	return s
}

// What a re-emission of Postgres's current version repairs, per problem
// and store.
func TestRepairItemClassification(t *testing.T) {
	for _, tc := range []struct {
		problem    string
		kind       verify.Kind
		repairable bool
		unsettled  bool
	}{
		{verify.Missing, verify.Index, true, true},
		{verify.StaleVersion, verify.Graph, true, true},
		{verify.StaleChunks, verify.Index, true, true},
		{verify.LinksMismatch, verify.Graph, true, true},
		{verify.ContentMismatch, verify.Graph, true, true},
		{verify.ContentMismatch, verify.Index, false, false},
		{verify.Extra, verify.Index, false, false},
		{verify.VersionMismatch, verify.Graph, false, false},
		{verify.DigestMismatch, verify.Index, false, true},
	} {
		d := verify.RepairItem{Store: string(tc.kind), Kind: tc.kind, Key: "k", Problem: tc.problem}
		if d.Repairable() != tc.repairable || d.Unsettled() != tc.unsettled {
			t.Errorf("%s in the %s: repairable %v, unsettled %v; want %v, %v", tc.problem, tc.kind, d.Repairable(), d.Unsettled(), tc.repairable, tc.unsettled)
		}
		if !tc.repairable && d.UnrepairableReason() == "" {
			t.Errorf("%s in the %s: no reason given", tc.problem, tc.kind)
		}
	}
}

// Run compares every projection and agrees only when each does.
func TestRunComparesEveryProjection(t *testing.T) {
	ctx := context.Background()
	truth := verifytest.NewSide("postgres", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h", 1), "b": verifytest.Doc("b", 1, "h", 1)})
	index := verifytest.NewSide("index", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h", 1), "b": verifytest.Doc("b", 1, "h", 1)})
	graph := verifytest.NewSide("graph", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h", 1)})
	var shown []string
	res, err := verify.Run(ctx, truth, []verify.Projection{{Kind: verify.Index, Side: index}, {Kind: verify.Graph, Side: graph}}, 16,
		func(store string, done, total int) { shown = append(shown, store) })
	if err != nil {
		t.Fatal(err)
	}
	if res.Agrees || len(res.Stores) != 2 || !res.Stores[0].Agrees || res.Stores[1].Agrees || res.Repair != nil {
		t.Fatalf("result %+v, want the index agreeing and the graph not", res)
	}
	if got := items(res.Differences()); !slices.Equal(got, []string{"graph missing b"}) {
		t.Fatalf("differences %v", got)
	}
	if !slices.Equal(shown, []string{"graph"}) {
		t.Fatalf("progress shown for %v, want the graph's one differing bucket", shown)
	}
	if _, err := verify.Run(ctx, truth, nil, 16, nil); err == nil {
		t.Fatal("Run without a projection succeeded")
	}
}

// Repair re-emits the documents of the repairable differences, sets the
// others apart with their reason, waits until the repairable ones are
// gone, and returns the stores as they are at the end.
func TestRepair(t *testing.T) {
	ctx := context.Background()
	truth, index, graph := verifytest.EveryDifference()
	truthSide := verifytest.NewSide("postgres", truth)
	stores := []verify.Projection{{Kind: verify.Index, Side: index}, {Kind: verify.Graph, Side: graph}}
	// A re-emission leaves the index's marker of c as it is.
	w := &verifytest.Reemitter{Truth: truth, Stores: []*verifytest.Side{index, graph}, Repairs: func(store, key string) bool { return store != "index" || key != "c" }}
	first, err := verify.Run(ctx, truthSide, stores, 64, nil)
	if err != nil || first.Agrees {
		t.Fatalf("first verify: agrees %v, %v", first.Agrees, err)
	}
	var steps []verify.RepairStep
	var reemitting []string
	res, err := verify.Repair(ctx, w, truthSide, stores, first, verify.RepairConfig{Buckets: 64, Timeout: 10 * time.Second, Interval: 10 * time.Millisecond,
		Progress: func(p verify.RepairProgress) {
			steps = append(steps, p.Step)
			if p.Step == verify.RepairClassified && len(p.Report.Unrepairable) != 3 {
				t.Errorf("classified with %d unrepairable differences, want 3", len(p.Report.Unrepairable))
			}
			if p.Step == verify.RepairReemitting {
				reemitting = p.Keys
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Asked(); !slices.Equal(got, []string{"a", "b", "c", "e"}) || !slices.Equal(reemitting, got) {
		t.Fatalf("re-emitted %v (announced %v), want [a b c e]: c for the graph's links, not for the index's marker", got, reemitting)
	}
	if !slices.Equal(steps, []verify.RepairStep{verify.RepairClassified, verify.RepairReemitting, verify.RepairWaiting, verify.RepairVerified}) {
		t.Fatalf("steps %v", steps)
	}
	rr := res.Repair
	if rr == nil || len(rr.Reemitted) != 4 || rr.Waited == "" {
		t.Fatalf("repair report %+v", rr)
	}
	if got, want := items(rr.Repaired), []string{"graph links_mismatch c", "index missing e", "index stale_chunks b", "index stale_version a"}; !slices.Equal(got, want) {
		t.Fatalf("repaired %v, want %v", got, want)
	}
	if got, want := items(rr.Unrepairable), []string{"index content_mismatch c", "index extra x", "index version_mismatch d"}; !slices.Equal(got, want) {
		t.Fatalf("unrepairable %v, want %v", got, want)
	}
	for _, d := range rr.Unrepairable {
		if d.Detail != d.UnrepairableReason() {
			t.Errorf("unrepairable %s %s: detail %q, want its reason", d.Problem, d.Key, d.Detail)
		}
	}
	if got := items(rr.Remaining); !slices.Equal(got, items(rr.Unrepairable)) {
		t.Fatalf("remaining %v, want the unrepairable ones", got)
	}
	if res.Agrees {
		t.Fatal("the stores agree although the index holds an extra document")
	}
}

// When nothing is repairable, nothing is re-emitted.
func TestRepairWithNothingRepairable(t *testing.T) {
	ctx := context.Background()
	truthSide := verifytest.NewSide("postgres", map[string]verify.Doc{})
	graph := verifytest.NewSide("graph", map[string]verify.Doc{"ghost": verifytest.Doc("ghost", 1, "x", 0)})
	stores := []verify.Projection{{Kind: verify.Graph, Side: graph}}
	first, err := verify.Run(ctx, truthSide, stores, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &verifytest.Reemitter{}
	res, err := verify.Repair(ctx, w, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Asked()) != 0 || res.Agrees || res.Repair == nil || len(res.Repair.Reemitted) != 0 ||
		!slices.Equal(items(res.Repair.Unrepairable), []string{"graph extra ghost"}) {
		t.Fatalf("asked %v; result agrees %v, repair %+v", w.Asked(), res.Agrees, res.Repair)
	}
}

// When the stores do not converge in time, Repair reports what was not
// repaired and the stores still disagree.
func TestRepairTimesOut(t *testing.T) {
	ctx := context.Background()
	truth := map[string]verify.Doc{"a": verifytest.Doc("a", 2, "h2", 1)}
	index := verifytest.NewSide("index", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h1", 1)})
	stores := []verify.Projection{{Kind: verify.Index, Side: index}}
	truthSide := verifytest.NewSide("postgres", truth)
	first, err := verify.Run(ctx, truthSide, stores, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := verify.Repair(ctx, &verifytest.Reemitter{Truth: truth}, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: 300 * time.Millisecond, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Agrees || len(res.Repair.Repaired) != 0 || !slices.Equal(items(res.Repair.Remaining), []string{"index stale_version a"}) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("after the timeout: agrees %v, report %+v", res.Agrees, res.Repair)
	}
}

// A writer that fails keeps its cause; what it re-emitted before is
// reported.
func TestRepairWriterFailure(t *testing.T) {
	ctx := context.Background()
	truth := map[string]verify.Doc{"a": verifytest.Doc("a", 2, "h2", 1)}
	index := verifytest.NewSide("index", map[string]verify.Doc{})
	stores := []verify.Projection{{Kind: verify.Index, Side: index}}
	truthSide := verifytest.NewSide("postgres", truth)
	first, err := verify.Run(ctx, truthSide, stores, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the writer is gone")
	var last *verify.RepairReport
	res, err := verify.Repair(ctx, &verifytest.Reemitter{Truth: truth, Err: cause}, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: time.Second,
		Progress: func(p verify.RepairProgress) { last = p.Report }})
	if !errors.Is(err, cause) {
		t.Fatalf("Repair: %v, want the writer's error", err)
	}
	if res.Repair != nil || res.Agrees || last == nil || len(last.Reemitted) != 1 {
		t.Fatalf("after the writer failed: result %+v, report so far %+v", res, last)
	}
	if _, err := verify.Repair(ctx, &verifytest.Reemitter{}, truthSide, stores, first, verify.RepairConfig{}); err == nil {
		t.Fatal("Repair without a timeout succeeded")
	}
}

// racingSide answers its first stale Digests calls from the state it had
// when it was made, and everything else from its current state: a store
// whose digests were read before a repair landed and its documents after.
type racingSide struct {
	*verifytest.Side
	before *verify.Memory
	mu     sync.Mutex
	stale  int
}

func (s *racingSide) Digests(ctx context.Context, kind verify.Kind, n int) ([]verify.BucketDigest, error) {
	s.mu.Lock()
	stale := s.stale > 0
	s.stale--
	s.mu.Unlock()
	if stale {
		return s.before.Digests(ctx, kind, n)
	}
	return s.Side.Digests(ctx, kind, n)
}

// A verify that reads a store's digests before the re-emitted events are
// applied and its documents after sees a digest mismatch with no
// differing document: Repair waits on through it, and reports the stores
// agreeing once they do, rather than ending on the mismatch.
func TestRepairWaitsThroughADigestMismatch(t *testing.T) {
	ctx := context.Background()
	truth := map[string]verify.Doc{"a": verifytest.Doc("a", 2, "h2", 1), "b": verifytest.Doc("b", 1, "hb", 1)}
	graph := verifytest.NewSide("graph", map[string]verify.Doc{"a": verifytest.Doc("a", 1, "h1", 1), "b": truth["b"]})
	racing := &racingSide{Side: graph, before: graph.Memory(), stale: 2} // the first verify, and the first after the repair
	stores := []verify.Projection{{Kind: verify.Graph, Side: racing}}
	truthSide := verifytest.NewSide("postgres", truth)
	w := &verifytest.Reemitter{Truth: truth, Stores: []*verifytest.Side{graph}, Repairs: func(string, string) bool { return true }}
	first, err := verify.Run(ctx, truthSide, stores, 16, nil)
	if err != nil || first.Agrees {
		t.Fatalf("first verify: agrees %v, %v", first.Agrees, err)
	}
	// The interval outlasts the reemitter's 50 ms before it repairs, so the
	// first verify after the re-emission reads the repaired documents
	// under the stale digests.
	res, err := verify.Repair(ctx, w, truthSide, stores, first, verify.RepairConfig{Buckets: 16, Timeout: 10 * time.Second, Interval: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Agrees || len(res.Repair.Repaired) != 1 || len(res.Repair.Remaining) != 0 {
		t.Fatalf("after the repair: agrees %v, repaired %v, remaining %v", res.Agrees, res.Repair.Repaired, res.Repair.Remaining)
	}
	if racing.stale >= 0 { // the stale digests, then at least one current
		t.Fatal("no verify after the stale digests: the test did not race")
	}
}
