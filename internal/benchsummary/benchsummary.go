// Package benchsummary is the one format of the rows of make bench's
// summary table: each benchmark that measures a target logs its row with
// [Log], and scripts/bench-summary.sh gathers the rows of a make bench's
// output into one table (the median row of each target over its runs).
package benchsummary

import (
	"strings"
	"testing"
)

// Row is one target's figure in one run.
type Row struct {
	Target string  // what is measured, e.g. "relay / pg_recvlogical"
	Figure string  // this run's figure, with its unit
	Limit  string  // what it is compared with, with its unit
	Ratio  float64 // Figure over Limit
	Goal   string  // the target on the ratio (or the figure), e.g. ">= 0.70"
	Met    bool
}

// Verdict is MET or MISSED.
func (r Row) Verdict() string {
	if r.Met {
		return "MET"
	}
	return "MISSED"
}

// Log logs r as a summary row: "SUMMARY|target|figure|limit|ratio|goal|verdict".
func Log(tb testing.TB, r Row) {
	tb.Helper()
	clean := func(s string) string { return strings.ReplaceAll(s, "|", "/") }
	tb.Logf("SUMMARY|%s|%s|%s|%.3f|%s|%s", clean(r.Target), clean(r.Figure), clean(r.Limit), r.Ratio, clean(r.Goal), r.Verdict())
}
