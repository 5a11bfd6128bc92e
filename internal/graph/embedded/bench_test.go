package embedded

import (
	"context"
	"fmt"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

// BenchmarkApply writes batches of 100 documents with 4 chunks, 3 links
// (one to a key never written: a stub) and 2 tags each, every document a
// newer version than the last, and reports docs/s.
func BenchmarkApply(b *testing.B) {
	for _, p := range waltest.SyncPolicies {
		b.Run(p.Name, func(b *testing.B) { benchmarkApply(b, p.Options) })
	}
}

func benchmarkApply(b *testing.B, opts Options) {
	const perBatch, batches, keys = 100, 50, 100 * 50
	s := openStore(b, b.TempDir(), opts)
	docs := make([][]graph.Doc, batches)
	for n := range keys {
		links := []string{fmt.Sprint("doc-", (n+1)%keys), fmt.Sprint("doc-", (n*7)%keys), fmt.Sprint("ext-", n%100)}
		docs[n/perBatch] = append(docs[n/perBatch], upsert(fmt.Sprint("doc-", n), 1, 4, links, []string{fmt.Sprint("t", n%10), "bench"}))
	}
	for i := 0; b.Loop(); i++ {
		batch := docs[i%batches]
		for j := range batch {
			batch[j].Version = int64(1 + i/batches)
		}
		applied, err := s.Apply(context.Background(), batch)
		if err != nil || !applied[0] {
			b.Fatalf("Apply: %v %v", applied, err)
		}
	}
	b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "docs/s")
}
