package qdrant_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/pkg/contract"
)

// BenchmarkUpsert measures Backend.Upsert into the in-process server with
// the default batching (128 points per request, 2 in flight): 1000 chunks
// of dimension 256 per operation, reported as points/s. It measures the
// adapter and the gRPC path, not Qdrant's storage.
func BenchmarkUpsert(b *testing.B) {
	const benchDim, perOp = 256, 1000
	be := open(b, qdranttest.Start(b), nil)
	must(b, be.Ensure(ctx(), benchDim))
	rng := rand.New(rand.NewPCG(1, 1))
	points := make([]index.Point, perOp)
	for i := range points {
		vec := make([]float32, benchDim)
		var norm float64
		for j := range vec {
			vec[j] = float32(rng.NormFloat64())
			norm += float64(vec[j] * vec[j])
		}
		for j := range vec {
			vec[j] /= float32(math.Sqrt(norm))
		}
		key := fmt.Sprintf("doc-%d", i/10)
		text := fmt.Sprintf("chunk %d of %s: some text of a typical chunk length, repeated to weigh like one. ", i%10, key)
		points[i] = index.Point{
			ID: contract.ChunkID(key, 1, i%10), Key: key, Version: 1, Ordinal: i % 10,
			ContentHash: contract.TextHash(key), ChunkHash: contract.TextHash(text),
			Title: "Title of " + key, Tags: []string{"bench"}, Text: text + text + text + text, Vector: vec,
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		must(b, be.Upsert(ctx(), points))
	}
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "points/s")
}
