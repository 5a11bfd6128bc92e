package verify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/converge-sync/converge/internal/writer"
)

// DefaultRepairInterval is how often [Repair] verifies again while it waits
// for the re-emitted documents to reach the stores.
const DefaultRepairInterval = 500 * time.Millisecond

// Reemitter re-emits the current version of documents from Postgres: the
// writer's client, [writer.Client].
type Reemitter interface {
	// ReemitKeys re-emits keys. On an error, the answer holds what was
	// re-emitted before it.
	ReemitKeys(ctx context.Context, keys []string) (writer.ReemitResponse, error)
}

// RepairReport is what [Repair] did.
type RepairReport struct {
	// Reemitted are the documents whose events were re-emitted.
	Reemitted []writer.ReemittedDocument `json:"reemitted"`
	// NotFound are keys Postgres no longer had when they were re-emitted.
	NotFound []string `json:"not_found"`
	// Repaired are the differences found first that verify no longer finds.
	Repaired []RepairItem `json:"repaired"`
	// Unrepairable are differences a re-emission cannot repair, each with
	// the reason as its Detail.
	Unrepairable []RepairItem `json:"unrepairable"`
	// Remaining are the differences of the last verify.
	Remaining []RepairItem `json:"remaining"`
	// Waited is how long the stores took to agree after the re-emission,
	// or how long they were waited for.
	Waited string `json:"waited"`
}

// RepairItem is one document on which one store disagreed.
type RepairItem struct {
	Store   string `json:"store"`
	Kind    Kind   `json:"-"`
	Key     string `json:"key"`
	Problem string `json:"problem"`
	Detail  string `json:"detail,omitempty"`
}

// Repairable reports whether re-emitting the document's current version
// from Postgres repairs the difference: the store lacks the document,
// holds an older version, or holds Postgres's version with other chunks,
// links, tags or (in the graph) content. A document in the store that
// Postgres does not have (extra) has nothing to re-emit; a store holding a
// version newer than Postgres's (version_mismatch) keeps it over the older
// re-emitted one by its freshness guard; the index's content at a version
// is its version marker, which a repair of the same version leaves as it
// is; a digest mismatch names no document.
func (d RepairItem) Repairable() bool {
	switch d.Problem {
	case Missing, StaleVersion, StaleChunks, LinksMismatch:
		return true
	case ContentMismatch:
		return d.Kind != Index
	}
	return false
}

// Unsettled reports whether d may still go away while the re-emitted
// events are applied: a repairable difference, or a digest mismatch, which
// a store still being written shows when it changes between the reading
// of its digests and of its documents.
func (d RepairItem) Unsettled() bool {
	return d.Repairable() || d.Problem == DigestMismatch
}

// UnrepairableReason explains why a difference stays.
func (d RepairItem) UnrepairableReason() string {
	switch d.Problem {
	case Extra:
		return "the store holds a document Postgres does not have: there is nothing to re-emit; rebuild the store to remove it"
	case VersionMismatch:
		return "the store holds a version newer than Postgres's, which its freshness guard keeps over a re-emitted older one; rebuild the store"
	case ContentMismatch:
		return "the index's version marker holds other content at Postgres's version, and a re-emission of that version leaves the marker as it is; rebuild the index"
	default:
		return "no document to re-emit"
	}
}

// RepairStep is a step of [Repair], told to [RepairConfig.Progress].
type RepairStep int

const (
	// RepairClassified: the first verify's differences are sorted;
	// Report.Unrepairable is final. When nothing is repairable, Repair
	// ends here.
	RepairClassified RepairStep = iota
	// RepairReemitting: Keys are about to be re-emitted.
	RepairReemitting
	// RepairWaiting: Report.Reemitted were re-emitted; Repair now verifies
	// every Interval until the stores agree or Timeout passes.
	RepairWaiting
	// RepairVerified: the last verify is done, Report is complete.
	RepairVerified
)

// RepairProgress is where [Repair] is.
type RepairProgress struct {
	Step RepairStep
	// Keys are the documents re-emitted, sorted (from RepairReemitting).
	Keys []string
	// Report is the report so far.
	Report *RepairReport
}

// RepairConfig of [Repair].
type RepairConfig struct {
	// Buckets is the number of digest buckets of each verify; default
	// [DefaultBuckets].
	Buckets int
	// Timeout is how long the stores are waited for after the
	// re-emission. Required.
	Timeout time.Duration
	// Interval is how often verify runs meanwhile; default
	// [DefaultRepairInterval].
	Interval time.Duration
	// Progress, if not nil, is told each step as it is reached.
	Progress func(RepairProgress)
	// Partitions restricts each verify after the re-emission as the first
	// one was (see [Partitions]); zero: the whole store.
	Partitions Partitions
}

// Validate checks c and sets its defaults.
func (c *RepairConfig) Validate() error {
	if c.Timeout <= 0 {
		return errors.New("verify: the repair's timeout must be positive")
	}
	if c.Buckets <= 0 {
		c.Buckets = DefaultBuckets
	}
	if c.Buckets > MaxBuckets {
		return fmt.Errorf("verify: %d buckets, at most %d", c.Buckets, MaxBuckets)
	}
	if c.Interval <= 0 {
		c.Interval = DefaultRepairInterval
	}
	return nil
}

// Repair repairs what first (a [Run] of the same projections) found, by
// re-emission: it re-emits through w every document of first's
// differences that a re-emission repairs, then runs verify again every
// Interval until no difference that may still go away (see
// [RepairItem.Unsettled]) is left or Timeout passes. It returns the last
// verify, with the repair's report in its Repair. A store damaged beyond
// what a re-emission repairs (see [RepairItem.Repairable]) is reported in
// Unrepairable and left as it is: rebuild it.
//
// Nothing is written but the re-emissions, which the writer records in
// the outbox; an interruption (an error, ctx ending) after them leaves
// them to be applied by the projectors, repairing the stores all the same.
func Repair(ctx context.Context, w Reemitter, truth Side, projections []Projection, first Result, cfg RepairConfig) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return first, err
	}
	progress := func(step RepairStep, keys []string, rr *RepairReport) {
		if cfg.Progress != nil {
			cfg.Progress(RepairProgress{Step: step, Keys: keys, Report: rr})
		}
	}
	rr := &RepairReport{Reemitted: []writer.ReemittedDocument{}, NotFound: []string{}, Repaired: []RepairItem{},
		Unrepairable: []RepairItem{}, Remaining: []RepairItem{}}
	found := first.Differences()
	var keys []string
	for _, d := range found {
		switch {
		case !d.Repairable():
			d.Detail = d.UnrepairableReason()
			rr.Unrepairable = append(rr.Unrepairable, d)
		case !slices.Contains(keys, d.Key):
			keys = append(keys, d.Key)
		}
	}
	progress(RepairClassified, nil, rr)
	if len(keys) == 0 {
		first.Repair = rr
		return first, nil
	}
	slices.Sort(keys)
	progress(RepairReemitting, keys, rr)
	res, err := w.ReemitKeys(ctx, keys)
	rr.Reemitted, rr.NotFound = append(rr.Reemitted, res.Reemitted...), append(rr.NotFound, res.NotFound...)
	if err != nil {
		return first, fmt.Errorf("repair: %w", err)
	}
	progress(RepairWaiting, keys, rr)

	start := time.Now()
	deadline := start.Add(cfg.Timeout)
	last := first
	for {
		t := time.NewTimer(cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return last, ctx.Err()
		case <-t.C:
		}
		rep, err := Run(ctx, truth, projections, cfg.Buckets, nil)
		if err != nil {
			return last, err
		}
		rep = cfg.Partitions.Apply(rep)
		last = rep
		remaining := rep.Differences()
		if !slices.ContainsFunc(remaining, RepairItem.Unsettled) || time.Now().After(deadline) {
			rr.Waited = time.Since(start).Round(10 * time.Millisecond).String()
			rr.Remaining = append(rr.Remaining, remaining...)
			for _, d := range found {
				if d.Repairable() && !slices.ContainsFunc(remaining, func(r RepairItem) bool { return r.Store == d.Store && r.Key == d.Key }) {
					rr.Repaired = append(rr.Repaired, d)
				}
			}
			last.Repair = rr
			progress(RepairVerified, keys, rr)
			return last, nil
		}
	}
}
