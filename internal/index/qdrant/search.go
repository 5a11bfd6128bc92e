package qdrant

import (
	"bytes"
	"context"
	"math"
	"slices"

	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/index"
)

// Search returns the k chunks nearest to vector, best first, equal scores
// in ascending point id order.
//
// Qdrant does not order equal scores, and may cut a run of them anywhere
// at the limit. So Search asks for k+1 hits: when the last two differ, the
// first k are the answer; when they tie, it asks again for every hit
// scoring at least the tied score, and picks the first k by (score, id).
func (b *Backend) Search(ctx context.Context, vector []float32, k int) ([]index.Hit, error) {
	if k <= 0 {
		return nil, nil
	}
	hits, err := b.query(ctx, vector, uint64(k)+1, nil)
	if err != nil {
		return nil, err
	}
	if len(hits) > k && hits[k].GetScore() == hits[k-1].GetScore() {
		// Just below the tied score, so that every tied hit is included
		// whether the server's threshold is inclusive or not.
		threshold := math.Nextafter32(hits[k-1].GetScore(), float32(math.Inf(-1)))
		for limit := 2 * (uint64(k) + 1); ; limit *= 2 {
			if hits, err = b.query(ctx, vector, limit, &threshold); err != nil {
				return nil, err
			}
			if uint64(len(hits)) < limit {
				break
			}
		}
	}
	out := make([]index.Hit, 0, len(hits))
	for _, h := range hits {
		p, err := decodeChunk(h.GetId(), h.GetPayload(), nil)
		if err != nil {
			return nil, err
		}
		out = append(out, index.Hit{Point: p, Score: h.GetScore()})
	}
	slices.SortFunc(out, func(a, b index.Hit) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return bytes.Compare(a.Point.ID[:], b.Point.ID[:])
	})
	return out[:min(k, len(out))], nil
}

func (b *Backend) query(ctx context.Context, vector []float32, limit uint64, threshold *float32) ([]*qd.ScoredPoint, error) {
	var hits []*qd.ScoredPoint
	err := b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetPointsClient().Query(ctx, &qd.QueryPoints{
			CollectionName: b.cfg.Collection,
			Query:          qd.NewQueryDense(vector),
			Filter:         onlyType(typeChunk),
			Limit:          &limit,
			ScoreThreshold: threshold,
			WithPayload:    qd.NewWithPayload(true),
			WithVectors:    qd.NewWithVectors(false),
		})
		hits = resp.GetResult()
		return err
	})
	if err != nil {
		return nil, b.fail("search", err)
	}
	return hits, nil
}
