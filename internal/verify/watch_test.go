package verify_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/verifytest"
	"github.com/converge-sync/converge/internal/writer"
)

// pipeline is Postgres and one store's projection in memory: each write
// takes Postgres to the next position, and the projection applies the
// writes in order when told to (or at once, with auto).
type pipeline struct {
	mu      sync.Mutex
	truth   *verifytest.Side
	store   *verifytest.Side
	writes  []verify.Doc // the write at position i+1
	applied int
	auto    bool
	reads   int // of Postgres's digests
	// afterRead, when set, runs after each read of Postgres, outside the
	// lock; whilePassing runs at each question to the projection's
	// progress, before it is answered.
	afterRead, whilePassing func()
}

func newPipeline() *pipeline {
	return &pipeline{truth: verifytest.NewSide("postgres", nil), store: verifytest.NewSide("graph", nil)}
}

func (p *pipeline) write(docs ...verify.Doc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.truth.Put(docs...)
	p.writes = append(p.writes, docs...)
	if p.auto {
		p.applyLocked(len(p.writes))
	}
}

func (p *pipeline) apply(upTo int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applyLocked(upTo)
}

func (p *pipeline) applyLocked(upTo int) {
	for ; p.applied < upTo; p.applied++ {
		p.store.Put(p.writes[p.applied])
	}
}

func (p *pipeline) setAuto() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.auto = true
	p.applyLocked(len(p.writes))
}

func (p *pipeline) Name() string { return "postgres" }

func (p *pipeline) DigestsAt(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int]verify.BucketDigest, verify.Position, error) {
	p.mu.Lock()
	p.reads++
	out, err := verify.DigestsOf(ctx, p.truth.Memory(), kind, n, buckets)
	pos := verify.Position(len(p.writes))
	after := p.afterRead
	p.mu.Unlock()
	if after != nil {
		after()
	}
	return out, pos, err
}

func (p *pipeline) BucketsAt(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, verify.Position, error) {
	p.mu.Lock()
	out, err := p.truth.Buckets(ctx, kind, n, buckets)
	pos := verify.Position(len(p.writes))
	after := p.afterRead
	p.mu.Unlock()
	if after != nil {
		after()
	}
	return out, pos, err
}

// Passed implements verify.Progress: the projection applied every write
// up to pos.
func (p *pipeline) Passed(_ context.Context, _ string, pos verify.Position) (bool, error) {
	if p.whilePassing != nil {
		p.whilePassing()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return verify.Position(p.applied) >= pos, nil
}

// reemitter re-emits through the pipeline: a new write of Postgres's
// document.
type reemitter struct{ p *pipeline }

func (r reemitter) ReemitKeys(ctx context.Context, keys []string) (writer.ReemitResponse, error) {
	resp := writer.ReemitResponse{}
	for _, k := range keys {
		m, _ := r.p.truth.Buckets(ctx, verify.Graph, 1, []int{0})
		for _, d := range m[0] {
			if d.Key == k {
				r.p.write(d)
				resp.Reemitted = append(resp.Reemitted, writer.ReemittedDocument{Key: k, Version: d.Version})
			}
		}
	}
	return resp, nil
}

func watch(t *testing.T, p *pipeline, cfg verify.WatchConfig) (*verify.Watcher, *verify.WatchMetrics, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	m := verify.NewWatchMetrics(prometheus.NewRegistry())
	cfg.Buckets, cfg.Step, cfg.Pass, cfg.Wait, cfg.Poll, cfg.Metrics = 8, 4, 20*time.Millisecond, 50*time.Millisecond, time.Millisecond, m
	cfg.Log = config.NewLogger(&syncWriter{w: &logs}, "info")
	w, err := verify.NewWatcher(p, []verify.Projection{{Kind: verify.Graph, Side: p.store}}, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return w, m, &logs
}

// syncWriter is a writer safe for the watcher's goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// eventually polls cond until it holds, at most 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func proofOf(w *verify.Watcher) verify.StoreProof { return w.Status().Stores[0] }

// The watcher proves a store in agreement only once its projection passed
// the position Postgres was read at: writes a projection has not applied
// yet are never named, and a step waits for them instead; a document
// damaged behind the projection's back is named after two comparisons in
// a row, re-emitted, and proven repaired.
func TestWatcherNamesWhatPersistsAfterTheProjectionPassed(t *testing.T) {
	p := newPipeline()
	for i := range 24 {
		p.write(verifytest.Doc(fmt.Sprintf("doc-%02d", i), 1, "h1", 2))
	}
	p.apply(24)
	w, m, logs := watch(t, p, verify.WatchConfig{Checks: 2, Reemitter: reemitter{p}})
	eventually(t, "proven", func() bool { pr := proofOf(w); return pr.ProvenFraction == 1 && pr.LastFullPass != nil })
	if pr := proofOf(w); pr.ProvenDocuments != 24 || len(pr.Differences) != 0 {
		t.Fatalf("proof %+v", pr)
	}

	// Behind: new versions Postgres holds and the projection does not yet.
	for i := range 6 {
		p.write(verifytest.Doc(fmt.Sprintf("doc-%02d", i), 2, "h2", 3))
	}
	p.mu.Lock()
	reads := p.reads
	p.mu.Unlock()
	eventually(t, "two passes", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.reads >= reads+4 })
	if n := testutil.ToFloat64(m.Named.WithLabelValues("graph")); n != 0 {
		t.Fatalf("%v differences named while the projection was behind:\n%s", n, logs)
	}
	if n := testutil.ToFloat64(m.Behind.WithLabelValues("graph")); n < 2 {
		t.Errorf("%v steps waited for the projection in vain, want every one since the writes", n)
	}
	applied := time.Now()
	p.apply(30)
	eventually(t, "proven after the projection caught up", func() bool {
		pr := proofOf(w)
		return pr.ProvenFraction == 1 && pr.ProvenSince != nil && pr.ProvenSince.After(applied)
	})

	// Damage behind the projection's back.
	p.setAuto()
	d := verifytest.Doc("doc-07", 1, "h1", 1)
	p.store.Put(d)
	eventually(t, "named", func() bool { return testutil.ToFloat64(m.Named.WithLabelValues("graph")) == 1 })
	eventually(t, "repaired", func() bool {
		return testutil.ToFloat64(m.Repairs.WithLabelValues("graph", "repaired")) == 1 && proofOf(w).ProvenFraction == 1
	})
	if !strings.Contains(logs.String(), `"key":"doc-07","problem":"stale_chunks"`) {
		t.Errorf("the log does not name doc-07's stale chunks:\n%s", logs)
	}
	if n := testutil.ToFloat64(m.Named.WithLabelValues("graph")); n != 1 {
		t.Errorf("%v differences named, want doc-07's alone:\n%s", n, logs)
	}
}

// A document written again after each read of Postgres, and applied by
// the projection before the store is read, differs at every comparison
// (the store ahead) and is never named: Postgres's document changed
// between any two comparisons.
func TestWatcherNeverNamesAWriteInFlight(t *testing.T) {
	p := newPipeline()
	for i := range 8 {
		p.write(verifytest.Doc(fmt.Sprintf("doc-%02d", i), 1, "h1", 2))
	}
	p.setAuto()
	var mu sync.Mutex
	version, reads := int64(1), 0
	p.afterRead = func() {
		mu.Lock()
		version++
		reads++
		v := version
		mu.Unlock()
		p.write(verifytest.Doc("doc-03", v, fmt.Sprintf("h%d", v), 2))
	}
	// Damage that differs while doc-03 is in flight: the digests differ,
	// and the documents are compared again and again.
	p.store.Put(verifytest.Doc("doc-05", 1, "h1", 1))
	w, m, logs := watch(t, p, verify.WatchConfig{Checks: 4})
	eventually(t, "doc-05 named", func() bool {
		return slices.ContainsFunc(proofOf(w).Differences, func(d verify.NamedDifference) bool { return d.Key == "doc-05" })
	})
	eventually(t, "several comparisons with doc-03 in flight", func() bool { mu.Lock(); defer mu.Unlock(); return reads >= 10 })
	if pr := proofOf(w); len(pr.Differences) != 1 || pr.DifferencesNamed != 1 || pr.Differences[0].Key != "doc-05" || pr.Differences[0].Problem != verify.StaleChunks {
		t.Fatalf("named %+v, want doc-05's stale chunks alone\n%s", pr.Differences, logs)
	}
	if n := testutil.ToFloat64(m.Named.WithLabelValues("graph")); n != 1 {
		t.Errorf("%v differences named, want 1\n%s", n, logs)
	}
}

// A bucket whose document is written while the watcher waits for the
// projection, each time, and applied by the projection before the store
// is read, is still proven: the store ahead holds what Postgres holds when
// asked again.
func TestWatcherProvesABucketBeingWritten(t *testing.T) {
	p := newPipeline()
	for i := range 8 {
		p.write(verifytest.Doc(fmt.Sprintf("doc-%02d", i), 1, "h1", 2))
	}
	p.setAuto()
	var mu sync.Mutex
	version := int64(1)
	p.whilePassing = func() {
		mu.Lock()
		version++
		v := version
		mu.Unlock()
		p.write(verifytest.Doc("doc-03", v, fmt.Sprintf("h%d", v), 2))
	}
	w, m, logs := watch(t, p, verify.WatchConfig{Checks: 4})
	eventually(t, "a bucket being written proven", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return version > 20 && proofOf(w).ProvenFraction == 1
	})
	if n := testutil.ToFloat64(m.Named.WithLabelValues("graph")); n != 0 {
		t.Errorf("%v differences named\n%s", n, logs)
	}
}
