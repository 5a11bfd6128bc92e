package embedded

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal/waltest"
)

// BenchmarkUpsert writes 1000 points of dimension 256 per op, 10 chunks
// per document, and reports points/s.
func BenchmarkUpsert(b *testing.B) {
	for _, bc := range waltest.SyncPolicies {
		b.Run(bc.Name, func(b *testing.B) {
			const dim, perOp = 256, 1000
			ctx := context.Background()
			s := open(b, b.TempDir(), bc.Options)
			must(b, s.Ensure(ctx, dim))
			r := rand.New(rand.NewPCG(1, 2))
			batches := make([][]index.Point, 8)
			for i := range batches {
				for d := range perOp / 10 {
					batches[i] = append(batches[i], docPoints(r, fmt.Sprint("doc-", i*perOp+d), 1, 10, dim)...)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				must(b, s.Upsert(ctx, batches[i%len(batches)]))
			}
			b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "points/s")
		})
	}
}

// BenchmarkSearch queries 100,000 points of dimension 256 for the top 10.
func BenchmarkSearch(b *testing.B) {
	const dim, n, k = 256, 100_000, 10
	ctx := context.Background()
	s := open(b, b.TempDir(), Options{SyncEvery: time.Second, CompactBytes: -1})
	must(b, s.Ensure(ctx, dim))
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < n; i += 1000 {
		var batch []index.Point
		for d := range 100 {
			batch = append(batch, docPoints(r, fmt.Sprint("doc-", i+d), 1, 10, dim)...)
		}
		must(b, s.Upsert(ctx, batch))
	}
	queries := make([][]float32, 16)
	for i := range queries {
		queries[i] = randVec(r, dim)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		hits, err := s.Search(ctx, queries[i%len(queries)], k)
		must(b, err)
		if len(hits) != k {
			b.Fatalf("%d hits", len(hits))
		}
	}
}

// BenchmarkCompact writes a snapshot of 50,000 points of dimension 256
// (about 55 MB) per op, and reports MB/s. Its records reuse one buffer, so
// the bytes allocated per op are a small fraction of the snapshot's size.
func BenchmarkCompact(b *testing.B) {
	const dim, docs, chunks = 256, 5000, 10
	ctx := context.Background()
	s := open(b, b.TempDir(), Options{CompactBytes: -1})
	must(b, s.Ensure(ctx, dim))
	r := rand.New(rand.NewPCG(1, 2))
	for d := range docs {
		must(b, s.Upsert(ctx, docPoints(r, fmt.Sprint("doc-", d), 1, chunks, dim)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		must(b, s.Compact(ctx))
	}
	size := int64(docs * chunks * (4*dim + 64)) // vectors and ids, at least
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
}
