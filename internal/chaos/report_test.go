//go:build linux

package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// checkedAfter is what the suite checks after every fault, before the
// next one; the end of the run checks the rest (see summary).
var checkedAfter = map[string]string{
	kindKillWriter:    "restarted; writes acknowledged again",
	kindKillRelayA:    "restarted; the standby took the slot; stream grows",
	kindKillRelayS:    "restarted as standby; stream grows",
	kindKillIndex:     "restarted; verify at the end",
	kindKillGraph:     "restarted; verify at the end",
	kindKillNotifier:  "restarted; each effect once, 2xx once",
	kindPauseWriter:   "resumed; writes acknowledged again",
	kindPauseRelayA:   "resumed; a relay holds the slot; stream grows",
	kindPauseRelayS:   "resumed; stream grows",
	kindPauseIndex:    "resumed; verify at the end",
	kindPauseGraph:    "resumed; verify at the end",
	kindPauseNotifier: "resumed; each effect once, 2xx once",
	kindReplayIndex:   "converge replay exit 0; verify at the end",
	kindReplayGraph:   "converge replay exit 0; verify at the end",
	kindCrashPostgres: "restarted on its data dir; writes acked again; stream grows",
	kindKillNATS:      "restarted on its store; every service ready; stream grows",
	kindCutLink:       "healed; every service ready; writes acked; stream grows",
	kindCutLinks:      "healed; every service ready; writes acked; stream grows",
	kindClockForward:  "every service ready; writes acked; each effect once",
	kindClockBack:     "every service ready; writes acked; each effect once",
	kindDiskFull:      "freed (JetStream restarted if it shut down); stream grows",
}

// faultMatrix is a table of the faults by kind: how many, the longest
// time until every service was ready, a write was acknowledged and the
// stream grew again after one, the checks that failed, the stored
// duplicates and the effects answered 2xx twice attributed to the kind,
// and what was checked after each.
func faultMatrix(faults []*fault, sr streamReport, er effectReport) string {
	type row struct {
		n                     int
		ready, writes, stream time.Duration
		failed                int
	}
	rows := map[string]*row{}
	for _, f := range faults {
		r := rows[f.Kind]
		if r == nil {
			r = &row{}
			rows[f.Kind] = r
		}
		r.n++
		r.ready, r.writes, r.stream = maxDur(r.ready, f.Ready), maxDur(r.writes, f.Writes), maxDur(r.stream, f.Stream)
		if f.Failed != "" {
			r.failed++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "FAULT MATRIX (%d faults)\n", len(faults))
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "fault kind\tcount\tmax to ready\tmax to write acked\tmax to stream grows\tfailed\tstored dups after\t2xx twice after\tchecked after it")
	total := 0
	for _, k := range kinds {
		r := rows[k]
		if r == nil {
			r = &row{}
		}
		total += r.n
		if r.n == 0 {
			fmt.Fprintf(w, "%s\t0\t-\t-\t-\t-\t%d\t%d\t%s\n", k, sr.ByCause[k], er.TwiceByCause[k], checkedAfter[k])
			continue
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", k, r.n, short(r.ready), short(r.writes), short(r.stream),
			r.failed, sr.ByCause[k], er.TwiceByCause[k], checkedAfter[k])
	}
	fmt.Fprintf(w, "(none before)\t\t\t\t\t\t%d\t%d\t\n", sr.ByCause["no fault"], er.TwiceByCause["unexplained"])
	fmt.Fprintf(w, "total\t%d\t\t\t\t\t%d\t%d\t\n", total, sr.Duplicates, er.Twice)
	_ = w.Flush()
	b.WriteString("After every fault: every service's /readyz, a relay holding the slot, a write acknowledged, the stream growing, " +
		"each within -chaos.recovery. At the end: the checks of the summary.\n")
	return b.String()
}

func maxDur(a, b time.Duration) time.Duration {
	if b < 0 || a < 0 {
		return -1
	}
	return max(a, b)
}

type summaryFigures struct {
	cfg               runConfig
	faults            []*fault
	loadTime          time.Duration
	load              *load
	writes            []write
	lost              int
	toVerify, toDrain time.Duration
	verified, drained bool
	outbox, docs      int
	stream            streamReport
	effects           effectReport
	dead              uint64
	p                 *pipeline
	backlog           *backlogs
}

func summary(s summaryFigures) string {
	results := map[string]int{}
	withdrawals := 0
	for _, w := range s.writes {
		results[w.Result]++
		if w.Withdraw {
			withdrawals++
		}
	}
	var b strings.Builder
	b.WriteString("SUMMARY\n")
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(what string, format string, args ...any) {
		fmt.Fprintf(w, "%s\t%s\n", what, fmt.Sprintf(format, args...))
	}
	row("seed", "%d (-chaos.seed=%d)", s.cfg.seed, s.cfg.seed)
	row("faults injected", "%d", len(s.faults))
	if len(s.cfg.notRun) > 0 {
		row("fault kinds not injected", "%s", strings.Join(s.cfg.notRun, "; "))
	}
	row("links cut or frozen", "%s", linkCounts(s.faults))
	row("index", "%s", s.cfg.indexStore())
	row("load", "%v, %d producers, %d documents, %.0f writes/s asked", s.loadTime.Round(time.Second), s.cfg.producers, s.cfg.docs, s.cfg.rate)
	row("writes acknowledged", "%d (%.0f/s; applied %d, unchanged %d, stale %d; %d withdrawals)", len(s.writes),
		float64(len(s.writes))/s.loadTime.Seconds(), results["applied"], results["unchanged"], results["stale"], withdrawals)
	row("write attempts not acknowledged (retried)", "%d of %d; refusals %v", s.load.failures.Load(), s.load.attempts.Load(), s.load.codes)
	row("acknowledged writes not in Postgres", "%d", s.lost)
	row("documents / outbox events", "%d / %d", s.docs, s.outbox)
	row("load end -> converge verify exit 0", "%s%s", short(s.toVerify), failedIf(!s.verified))
	row("load end -> every consumer drained", "%s%s", short(s.toDrain), failedIf(!s.drained))
	if s.backlog != nil {
		row("consumer backlogs (pending + unacknowledged, sampled every 2 s)", "%s", s.backlog)
	}
	row("stream messages stored at the end / distinct events", "%d / %d", s.stream.Stored, s.stream.Distinct)
	row("messages stored over the run / outbox events", "%d / %d (%+d); %d purged before the tap read them",
		s.stream.EverStored, s.outbox, int64(s.stream.EverStored)-int64(s.outbox), s.stream.Unread)
	row("stored duplicates (copies beyond the first)", "%d, of %d events; by cause %s", s.stream.Duplicates, s.stream.DuplicateEvents, causes(s.stream.ByCause))
	row("stored events not in the outbox", "%d", s.stream.Phantoms)
	row("keys without their newest event stored", "%d", s.stream.MissingNewest)
	row("keys with a version skipped in the stream", "%d out of commit order; %d pushed out of the history by an older version stored again (a duplicate)", s.stream.Gaps, s.stream.GapsByDuplicate)
	if s.stream.MissingAll >= 0 {
		row("outbox events not stored", "%d", s.stream.MissingAll)
	}
	e := s.effects
	row("notifications received / events", "%d / %d (%.1f%%), %d requests", e.Notified, e.Events, pct(e.Notified, e.Events), e.Requests)
	row("events never notified", "%d", e.Missing)
	row("effects answered 2xx twice", "%d; by cause %s", e.Twice, causes(e.TwiceByCause))
	row("requests: wrong key / several keys / unsigned / no event", "%d / %d / %d / %d", e.WrongKeys, e.ManyKeys, e.Invalid, e.Phantoms)
	row("dead letters", "%d", s.dead)
	for _, svc := range s.p.services {
		if ex := svc.exits(); len(ex) > 0 {
			row(svc.name+" exited on its own", "%d times (restarted)", len(ex))
		}
	}
	_ = w.Flush()
	return b.String()
}

// linkCounts says how often each link was cut or frozen.
func linkCounts(faults []*fault) string {
	n := map[string]int{}
	for _, f := range faults {
		for _, l := range f.Links {
			n[l]++
		}
	}
	return causes(n)
}

func failedIf(failed bool) string {
	if failed {
		return " (NOT REACHED)"
	}
	return ""
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func causes(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
