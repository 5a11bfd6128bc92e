package embedded

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
)

// Searches over more points than this are split across goroutines.
const searchShard = 16384

type candidate struct {
	p     *index.Point
	score float32
}

func compareIDs(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }

// ranksBelow reports whether a ranks after b: a lower score, or the same
// score and a greater ID.
func ranksBelow(a, b candidate) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return compareIDs(a.p.ID, b.p.ID) > 0
}

// topK keeps the k best candidates in a heap whose root is the worst.
type topK struct {
	k int
	h []candidate
}

func (t *topK) offer(c candidate) {
	if len(t.h) < t.k {
		t.h = append(t.h, c)
		t.up(len(t.h) - 1)
		return
	}
	if !ranksBelow(t.h[0], c) {
		return
	}
	t.h[0] = c
	t.down(0)
}

func (t *topK) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !ranksBelow(t.h[i], t.h[parent]) {
			return
		}
		t.h[i], t.h[parent] = t.h[parent], t.h[i]
		i = parent
	}
}

func (t *topK) down(i int) {
	n := len(t.h)
	for {
		worst := i
		if l := 2*i + 1; l < n && ranksBelow(t.h[l], t.h[worst]) {
			worst = l
		}
		if r := 2*i + 2; r < n && ranksBelow(t.h[r], t.h[worst]) {
			worst = r
		}
		if worst == i {
			return
		}
		t.h[i], t.h[worst] = t.h[worst], t.h[i]
		i = worst
	}
}

// scan offers every point of ps to t, checking ctx now and then.
func (t *topK) scan(ctx context.Context, q []float32, ps []*index.Point) error {
	for i, p := range ps {
		if i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		score := dot(q, p.Vector)
		// Most points lose to a full heap's worst; skip the call for them.
		if len(t.h) == t.k && score < t.h[0].score {
			continue
		}
		t.offer(candidate{p: p, score: score})
	}
	return nil
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Search returns the k points most similar to vector by cosine, best
// first, ties broken by ascending point ID; see [index.Backend]. It is an
// exact scan of every point, split across GOMAXPROCS goroutines when the
// store is large.
func (s *Store) Search(ctx context.Context, vector []float32, k int) ([]index.Hit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if k <= 0 {
		return nil, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.log.Closed() {
		return nil, ErrClosed
	}
	if len(s.all) == 0 {
		return nil, nil
	}
	if len(vector) != s.dim {
		return nil, fmt.Errorf("%w: the query has %d dimensions, the store holds %d", ErrDimensionMismatch, len(vector), s.dim)
	}
	q, err := normalize(vector)
	if err != nil {
		return nil, fmt.Errorf("embedded index: query: %w", err)
	}

	shards := min(runtime.GOMAXPROCS(0), (len(s.all)+searchShard-1)/searchShard)
	tops := make([]topK, shards)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	for i := range tops {
		lo, hi := i*len(s.all)/shards, (i+1)*len(s.all)/shards
		tops[i] = topK{k: k, h: make([]candidate, 0, min(k, hi-lo))}
		if shards == 1 {
			errs[i] = tops[i].scan(ctx, q, s.all[lo:hi])
			break
		}
		wg.Go(func() { errs[i] = tops[i].scan(ctx, q, s.all[lo:hi]) })
	}
	wg.Wait()
	var all []candidate
	for i := range tops {
		if errs[i] != nil {
			return nil, errs[i]
		}
		all = append(all, tops[i].h...)
	}
	slices.SortFunc(all, func(a, b candidate) int {
		switch {
		case ranksBelow(b, a):
			return -1
		case ranksBelow(a, b):
			return 1
		}
		return 0
	})
	all = all[:min(k, len(all))]
	hits := make([]index.Hit, len(all))
	for i, c := range all {
		hits[i] = index.Hit{Point: copyPoint(c.p, false), Score: c.score}
	}
	return hits, nil
}
