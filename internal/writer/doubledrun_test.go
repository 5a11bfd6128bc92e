package writer_test

// The doubled-run test: a fixed corpus (internal/testenv/corpus) is loaded
// through the real HTTP API, loaded again, and loaded a third time shuffled
// with every request sent three times. Idempotent ingestion means the
// second and third loads change nothing: same row counts, same table
// checksums, same contents, and exactly one outbox event per applied
// (key, version).
//
// doubledrun_load_test.go sends the corpus, doubledrun_plan_test.go cuts it
// into requests, doubledrun_snapshot_test.go and doubledrun_check_test.go
// compare what the database holds.

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/testenv/corpus"
)

const (
	drCorpusSeed = 0x5eedd0b1ed
	drCorpusKeys = 1100
	// drPlanStream and seeds next to drCorpusSeed make the plans' random
	// orders: fixed, so that every run sends the same requests.
	drPlanStream = 20260818
	// drMaxBatchLines lets NDJSON requests span several store transactions
	// (newEnv configures BatchSize 100), so results stream back while the
	// rest of the body is still being read.
	drMaxBatchLines = 250
)

// drLoadInOrder sends the corpus in version order per key and checks that
// every write applied.
func drLoadInOrder(t *testing.T, ctx context.Context, label string, l *drLoader, c *corpus.Corpus, units []drUnit, expect func(*corpus.Op) string) {
	t.Helper()
	before := l.requests.Load()
	start := time.Now()
	recs, errs := l.load(ctx, 4, units)
	drFatalErrs(t, label, errs)
	if len(recs) != len(c.Ops) {
		t.Fatalf("%s: %d answers, want one per op (%d)", label, len(recs), len(c.Ops))
	}
	counts := drCheckResults(t, label, recs, expect)
	t.Logf("%s: %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d unchanged, %d stale, %d errors",
		label, len(recs), l.requests.Load()-before, counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["unchanged"], counts["stale"], counts["error"])
}

func TestDoubledRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := corpus.Generate(drCorpusSeed, drCorpusKeys)
	if len(c.Keys) < 1000 {
		t.Fatalf("corpus has %d keys, want at least 1000", len(c.Keys))
	}
	withdrawnAtEnd := 0
	for _, k := range c.Keys {
		if c.Final[k].Withdraw {
			withdrawnAtEnd++
		}
	}
	t.Logf("corpus: %d keys, %d ops (%d upserts, %d withdrawals), %d keys end withdrawn",
		len(c.Keys), len(c.Ops), c.Upserts(), len(c.Ops)-c.Upserts(), withdrawnAtEnd)

	env := newEnv(t)
	l := drNewLoader(t, env.srv.URL)
	rng := rand.New(rand.NewPCG(drCorpusSeed+1, drPlanStream))
	plan := drPlanInOrder(c, rng)

	// In order, every op applies: one event per op of the corpus.
	wantOutbox := map[drEvKey]bool{}
	for _, o := range c.Ops {
		wantOutbox[drEvKey{o.Key, o.Version, string(o.Kind())}] = true
	}
	// After the first load, a key's final op is unchanged and the others stale.
	replay := func(o *corpus.Op) string {
		if c.Final[o.Key] == o {
			return "unchanged"
		}
		return "stale"
	}

	// Load 1.
	drLoadInOrder(t, ctx, "load 1", l, c, plan, func(*corpus.Op) string { return "applied" })
	first := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 1: %s", drTableCounts(first))
	if got := first.Tables["documents"].Count; got != int64(len(c.Keys)) {
		t.Errorf("load 1: %d documents, want one per key (%d)", got, len(c.Keys))
	}
	drCheckAgainstCorpus(t, ctx, "load 1", env.pool, c)
	drCheckOutboxExact(t, ctx, "load 1", env.pool, wantOutbox)
	drCheckOutboxEvents(t, ctx, "load 1", env.pool, c)
	getKeys := slices.Clone(corpus.SpecialKeys)
	for range 10 {
		getKeys = append(getKeys, c.Keys[rng.IntN(len(c.Keys))])
	}
	drCheckGet(t, ctx, l, c, getKeys)
	if t.Failed() {
		t.FailNow()
	}

	// Load 2: the same load again.
	drLoadInOrder(t, ctx, "load 2", l, c, plan, replay)
	second := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 2: %s", drTableCounts(second))
	drCompareStates(t, "load 2", first, second, "documents", "chunks", "outbox")
	if second.Stamps != first.Stamps {
		t.Errorf("load 2 rewrote rows: the timestamps of documents or outbox changed")
	}
	drCheckOutboxExact(t, ctx, "load 2", env.pool, wantOutbox)

	// Load 3: shuffled, every op three times, some copies concurrently.
	units := drPlanShuffled(c, rng, 3)
	before := l.requests.Load()
	start := time.Now()
	recs, errs := l.load(ctx, 8, units)
	drFatalErrs(t, "load 3", errs)
	sent := map[*corpus.Op]int{}
	for _, r := range recs {
		sent[r.op]++
	}
	for _, o := range c.Ops {
		if sent[o] != 3 {
			t.Errorf("load 3: %s answered %d times, want 3", o, sent[o])
		}
	}
	counts := drCheckResults(t, "load 3", recs, replay)
	t.Logf("load 3: %d sends of %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d unchanged, %d stale, %d errors",
		len(recs), len(c.Ops), l.requests.Load()-before, counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["unchanged"], counts["stale"], counts["error"])
	third := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 3: %s", drTableCounts(third))
	drCompareStates(t, "load 3", first, third, "documents", "chunks", "outbox")
	if third.Stamps != first.Stamps {
		t.Errorf("load 3 rewrote rows: the timestamps of documents or outbox changed")
	}
	drCheckOutboxExact(t, ctx, "load 3", env.pool, wantOutbox)
	t.Logf("requests sent in all: %d", l.requests.Load())
}

// TestShuffledLoadConverges loads the corpus once in random order (older
// versions after newer ones) into a fresh database: documents and chunks
// must end exactly as after an in-order load, and the outbox must hold
// exactly one valid event per applied version. With 8 workers, versions of
// one key often race each other here, which the in-order loads never do.
func TestShuffledLoadConverges(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := corpus.Generate(drCorpusSeed, drCorpusKeys)
	rng := rand.New(rand.NewPCG(drCorpusSeed+2, drPlanStream))

	inOrder := newEnv(t)
	lo := drNewLoader(t, inOrder.srv.URL)
	drLoadInOrder(t, ctx, "in-order load", lo, c, drPlanInOrder(c, rng), func(*corpus.Op) string { return "applied" })
	want := drSnapshot(t, ctx, inOrder.pool)

	shuffled := newEnv(t)
	ls := drNewLoader(t, shuffled.srv.URL)
	start := time.Now()
	recs, errs := ls.load(ctx, 8, drPlanShuffled(c, rng, 1))
	drFatalErrs(t, "shuffled load", errs)
	if len(recs) != len(c.Ops) {
		t.Fatalf("shuffled load: %d answers, want one per op (%d)", len(recs), len(c.Ops))
	}
	// Each version is sent once: it applies or finds a newer one; the
	// final version of each key always applies.
	counts := drCheckResults(t, "shuffled load", recs, func(o *corpus.Op) string {
		if c.Final[o.Key] == o {
			return "applied"
		}
		return ""
	})
	applied := map[drEvKey]bool{}
	lim := &drLimiter{t: t, label: "shuffled load"}
	for _, r := range recs {
		switch r.res.Result {
		case "applied":
			applied[drEvKey{r.op.Key, r.op.Version, string(r.op.Kind())}] = true
		case "stale":
			if r.op.Version >= c.Final[r.op.Key].Version {
				lim.errorf("%s answered stale, but no newer version exists", r.op)
			}
		default:
			lim.errorf("%s answered %q, want applied or stale", r.op, r.res.Result)
		}
	}
	lim.done()
	got := drSnapshot(t, ctx, shuffled.pool)
	t.Logf("shuffled load: %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d stale; %s (in order: %s)",
		len(recs), ls.requests.Load(), counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["stale"], drTableCounts(got), drTableCounts(want))

	drCompareStates(t, "shuffled vs in-order", want, got, "documents", "chunks")
	drCheckAgainstCorpus(t, ctx, "shuffled load", shuffled.pool, c)
	// The outbox holds one event per applied version, and nothing else.
	drCheckOutboxExact(t, ctx, "shuffled load", shuffled.pool, applied)
	drCheckOutboxEvents(t, ctx, "shuffled load", shuffled.pool, c)
}
