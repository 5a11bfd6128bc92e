package verify

import (
	"context"
	"errors"
)

// Projection is a store to verify: what its digests cover, and the side
// that answers for it (a [Remote] asked of its projector, or a [Memory]).
type Projection struct {
	Kind Kind
	Side Side
}

// Result is the outcome of verifying projections against Postgres.
type Result struct {
	// Agrees is true when every store agrees.
	Agrees bool     `json:"agrees"`
	Stores []Report `json:"stores"`
	// Repair is what [Repair] did; Stores is then the verify after it.
	Repair *RepairReport `json:"repair,omitempty"`
}

// Run compares each projection with truth (Postgres), one after another,
// with n buckets. progress, if not nil, is called after each differing
// bucket of a store is compared, with the store's name.
func Run(ctx context.Context, truth Side, projections []Projection, n int, progress func(store string, done, total int)) (Result, error) {
	res := Result{Agrees: true}
	if len(projections) == 0 {
		return res, errors.New("verify: no store to verify")
	}
	for _, p := range projections {
		var show func(done, total int)
		if progress != nil {
			name := p.Side.Name()
			show = func(done, total int) { progress(name, done, total) }
		}
		r, err := Compare(ctx, truth, p.Side, p.Kind, n, show)
		if err != nil {
			return res, err
		}
		res.Stores = append(res.Stores, r)
		res.Agrees = res.Agrees && r.Agrees
	}
	return res, nil
}

// Differences lists the differences of every store of r, in store order.
func (r Result) Differences() []RepairItem {
	var out []RepairItem
	for _, s := range r.Stores {
		for _, d := range s.Differences {
			out = append(out, RepairItem{Store: s.Store, Kind: s.Kind, Key: d.Key, Problem: d.Problem, Detail: d.Detail})
		}
	}
	return out
}
