package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
)

// hintedWriter is the writer's client whose errors, when the writer did
// not answer, say where converge looked for it.
type hintedWriter struct{ *writer.Client }

func (w hintedWriter) ReemitKeys(ctx context.Context, keys []string) (writer.ReemitResponse, error) {
	res, err := w.Client.ReemitKeys(ctx, keys)
	return res, writerHint(err)
}

func progressOut(show bool, out io.Writer) io.Writer {
	if show {
		return out
	}
	return io.Discard
}

// printRepairProgress says, as verify --repair goes, what it cannot
// repair, what it re-emits through the writer at writerURL, and when it
// verified again.
func printRepairProgress(out io.Writer, writerURL string, timeout time.Duration) func(verify.RepairProgress) {
	return func(p verify.RepairProgress) {
		switch p.Step {
		case verify.RepairClassified:
			for _, d := range p.Report.Unrepairable {
				fmt.Fprintf(out, "repair: cannot repair %s %s %s by re-emission: %s\n", d.Store, d.Problem, d.Key, d.Detail)
			}
		case verify.RepairReemitting:
			fmt.Fprintf(out, "repair: re-emitting %d documents through the writer at %s\n", len(p.Keys), writerURL)
		case verify.RepairWaiting:
			fmt.Fprintf(out, "repair: re-emitted %d documents; waiting up to %v for the stores to agree\n", len(p.Report.Reemitted), timeout)
		case verify.RepairVerified:
			fmt.Fprintf(out, "repair: verified again %s after the re-emission:\n", p.Report.Waited)
		}
	}
}

// printRepaired says what --repair did, after the final verify's report.
func printRepaired(out io.Writer, rr *verify.RepairReport) {
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
		if d.Repairable() {
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
