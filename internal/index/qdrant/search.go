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
// scoring at least the tied score, doubling the limit until it has them
// all, and picks the first k by (score, id).
//
// No request asks for more than the collection's strict-mode
// max_query_limit, which Qdrant would refuse. Under a limit of k or less,
// Search returns at most that many hits; and a run of equal scores that
// reaches past the limit is resolved as well as the limit allows: the hits
// are still ordered by (score, id), but of the tied ones only those the
// server returned within the limit are among them, not necessarily the
// lowest ids.
func (b *Backend) Search(ctx context.Context, vector []float32, k int) ([]index.Hit, error) {
	if k <= 0 {
		return nil, nil
	}
	maxLimit, err := b.maxQueryLimit(ctx)
	if err != nil {
		return nil, err
	}
	first := min(uint64(k)+1, maxLimit)
	hits, err := b.query(ctx, vector, first, nil)
	if err != nil {
		return nil, err
	}
	if len(hits) > k && hits[k].GetScore() == hits[k-1].GetScore() && first < maxLimit {
		// Just below the tied score, so that every tied hit is included
		// whether the server's threshold is inclusive or not.
		threshold := math.Nextafter32(hits[k-1].GetScore(), float32(math.Inf(-1)))
		for limit := min(2*first, maxLimit); ; limit = min(2*limit, maxLimit) {
			if hits, err = b.query(ctx, vector, limit, &threshold); err != nil {
				return nil, err
			}
			if uint64(len(hits)) < limit || limit == maxLimit {
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

// maxQueryLimit is the collection's max_query_limit (noQueryLimit without
// one), from Ensure or asked once.
func (b *Backend) maxQueryLimit(ctx context.Context) (uint64, error) {
	if l := b.queryLimit.Load(); l > 0 {
		return l, nil
	}
	info, err := b.info(ctx)
	if err != nil {
		return 0, b.fail("get collection", err)
	}
	l := queryLimitOf(info)
	b.queryLimit.Store(l)
	return l, nil
}

// queryLimitOf is the max_query_limit strict mode sets on the collection,
// or noQueryLimit. A limit of 0 (which Qdrant would enforce as refusing
// every query) is taken as 1, so that the result is never unknown.
func queryLimitOf(info *qd.CollectionInfo) uint64 {
	sm := info.GetConfig().GetStrictModeConfig()
	if !sm.GetEnabled() || sm.MaxQueryLimit == nil {
		return noQueryLimit
	}
	return max(uint64(sm.GetMaxQueryLimit()), 1)
}
