package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
)

// repairPollInterval is how often verify --repair verifies again while it
// waits for the re-emitted documents to reach the stores.
const repairPollInterval = 500 * time.Millisecond

// repairReport is what verify --repair did.
type repairReport struct {
	// Reemitted are the documents whose events were re-emitted.
	Reemitted []writer.ReemittedDocument `json:"reemitted"`
	// NotFound are keys Postgres no longer had when they were re-emitted.
	NotFound []string `json:"not_found"`
	// Repaired are the differences found first that verify no longer finds.
	Repaired []repairItem `json:"repaired"`
	// Unrepairable are differences a re-emission cannot repair.
	Unrepairable []repairItem `json:"unrepairable"`
	// Remaining are the differences of the last verify.
	Remaining []repairItem `json:"remaining"`
	// Waited is how long the stores took to agree after the re-emission,
	// or how long they were waited for.
	Waited string `json:"waited"`
}

// repairItem is one document on which one store disagreed.
type repairItem struct {
	Store   string      `json:"store"`
	Kind    verify.Kind `json:"-"`
	Key     string      `json:"key"`
	Problem string      `json:"problem"`
	Detail  string      `json:"detail,omitempty"`
}

// repairable reports whether re-emitting the document's current version
// from Postgres repairs the difference: the store lacks the document,
// holds an older version, or holds Postgres's version with other chunks,
// links, tags or (in the graph) content. A document in the store that
// Postgres does not have (extra) has nothing to re-emit; a store holding a
// version newer than Postgres's (version_mismatch) keeps it over the older
// re-emitted one by its freshness guard; the index's content at a version
// is its version marker, which a repair of the same version leaves as it
// is; a digest mismatch names no document.
func (d repairItem) repairable() bool {
	switch d.Problem {
	case verify.Missing, verify.StaleVersion, verify.StaleChunks, verify.LinksMismatch:
		return true
	case verify.ContentMismatch:
		return d.Kind != verify.Index
	}
	return false
}

// unsettled reports whether d may still go away while the re-emitted
// events are applied: a repairable difference, or a digest mismatch, which
// a store still being written shows when it changes between the reading
// of its digests and of its documents.
func (d repairItem) unsettled() bool {
	return d.repairable() || d.Problem == verify.DigestMismatch
}

// unrepairableReason explains why a difference stays.
func (d repairItem) unrepairableReason() string {
	switch d.Problem {
	case verify.Extra:
		return "the store holds a document Postgres does not have: there is nothing to re-emit; rebuild the store to remove it"
	case verify.VersionMismatch:
		return "the store holds a version newer than Postgres's, which its freshness guard keeps over a re-emitted older one; rebuild the store"
	case verify.ContentMismatch:
		return "the index's version marker holds other content at Postgres's version, and a re-emission of that version leaves the marker as it is; rebuild the index"
	default:
		return "no document to re-emit"
	}
}

func progressOut(show bool, out io.Writer) io.Writer {
	if show {
		return out
	}
	return io.Discard
}

// repairStores re-emits, through the writer, every document of first's
// differences that a re-emission repairs, then verifies again every
// interval until every repairable difference is gone or timeout passes. It
// returns the last verify, with the repair's report.
func repairStores(ctx context.Context, wc *writer.Client, truth verify.Side, stores []namedSide, buckets int,
	first verifyReport, timeout, interval time.Duration, out io.Writer) (verifyReport, error) {
	rr := &repairReport{Reemitted: []writer.ReemittedDocument{}, NotFound: []string{}, Repaired: []repairItem{},
		Unrepairable: []repairItem{}, Remaining: []repairItem{}}
	found := differences(first)
	var keys []string
	for _, d := range found {
		switch {
		case !d.repairable():
			d.Detail = d.unrepairableReason()
			rr.Unrepairable = append(rr.Unrepairable, d)
		case !slices.Contains(keys, d.Key):
			keys = append(keys, d.Key)
		}
	}
	for _, d := range rr.Unrepairable {
		fmt.Fprintf(out, "repair: cannot repair %s %s %s by re-emission: %s\n", d.Store, d.Problem, d.Key, d.Detail)
	}
	if len(keys) == 0 {
		first.Repair = rr
		return first, nil
	}
	slices.Sort(keys)
	fmt.Fprintf(out, "repair: re-emitting %d documents through the writer at %s\n", len(keys), wc.URL())
	res, err := wc.ReemitKeys(ctx, keys)
	rr.Reemitted, rr.NotFound = append(rr.Reemitted, res.Reemitted...), append(rr.NotFound, res.NotFound...)
	if err != nil {
		return first, fmt.Errorf("repair: %w", writerHint(err))
	}
	fmt.Fprintf(out, "repair: re-emitted %d documents; waiting up to %v for the stores to agree\n", len(rr.Reemitted), timeout)

	start := time.Now()
	deadline := start.Add(timeout)
	last := first
	for {
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return last, ctx.Err()
		case <-t.C:
		}
		rep, err := runVerify(ctx, truth, stores, buckets, false)
		if err != nil {
			return last, err
		}
		last = rep
		remaining := differences(rep)
		if !slices.ContainsFunc(remaining, repairItem.unsettled) || time.Now().After(deadline) {
			rr.Waited = time.Since(start).Round(10 * time.Millisecond).String()
			fmt.Fprintf(out, "repair: verified again %s after the re-emission:\n", rr.Waited)
			rr.Remaining = append(rr.Remaining, remaining...)
			for _, d := range found {
				if d.repairable() && !slices.ContainsFunc(remaining, func(r repairItem) bool { return r.Store == d.Store && r.Key == d.Key }) {
					rr.Repaired = append(rr.Repaired, d)
				}
			}
			last.Repair = rr
			return last, nil
		}
	}
}

// differences lists the differences of every store of rep.
func differences(rep verifyReport) []repairItem {
	var out []repairItem
	for _, r := range rep.Stores {
		for _, d := range r.Differences {
			out = append(out, repairItem{Store: r.Store, Kind: r.Kind, Key: d.Key, Problem: d.Problem, Detail: d.Detail})
		}
	}
	return out
}

// printRepaired says what --repair did, after the final verify's report.
func printRepaired(out io.Writer, rr *repairReport) {
	if len(rr.Repaired) > 0 {
		fmt.Fprintf(out, "repaired %d differences (in %s):\n", len(rr.Repaired), rr.Waited)
		for i, d := range rr.Repaired {
			if i == 50 {
				fmt.Fprintf(out, "  ... and %d more (--json lists all)\n", len(rr.Repaired)-50)
				break
			}
			fmt.Fprintf(out, "  %-6s %-16s %s\n", d.Store, d.Problem, d.Key)
		}
	}
	if len(rr.NotFound) > 0 {
		fmt.Fprintf(out, "not re-emitted, no longer in Postgres: %s\n", strings.Join(rr.NotFound, ", "))
	}
	var left []string
	for _, d := range rr.Remaining {
		if d.repairable() {
			left = append(left, d.Store+" "+d.Problem+" "+d.Key)
		}
	}
	if len(left) > 0 {
		fmt.Fprintf(out, "not repaired after waiting %s: %s\n", rr.Waited, strings.Join(left, "; "))
	}
	if n := len(rr.Unrepairable); n > 0 {
		fmt.Fprintf(out, "%d differences cannot be repaired by re-emission (see above)\n", n)
	}
}
