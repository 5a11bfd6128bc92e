package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/writer"
)

// envWriterURL names the writer's API for the operator's commands.
const envWriterURL = "CONVERGE_WRITER_URL"

// newWriterClient is the client of the writer at base, without a token,
// trusting the system's roots.
func newWriterClient(base string) (*writer.Client, error) {
	return apiAccess{}.writer(base)
}

// writerHint adds, to the error of a writer that did not answer, where
// its address comes from.
func writerHint(err error) error {
	return serviceHint[*writer.APIError](err, "the writer", "-writer-url, env "+envWriterURL)
}

// backfillReport is what backfill did, for --json.
type backfillReport struct {
	Reemitted []writer.ReemittedDocument `json:"reemitted"`
	NotFound  []string                   `json:"not_found"`
	// Next is where an interrupted --all stopped: resume with -after Next.
	Next string `json:"next,omitempty"`
}

// backfill re-emits documents through the writer: their current version's
// event is written to the outbox again, relayed, and rewritten by every
// projection (see docstore.Store.Reemit). Re-emission needs a token with
// the admin scope, from CONVERGE_TOKEN.
func backfill(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge backfill")
	writerURL := f.String("writer-url", envWriterURL, "http://127.0.0.1:8080", "the writer's API")
	keysFlag := f.String("keys", "", "", "re-emit these documents: keys separated by commas")
	all := f.Bool("all", "", false, "re-emit every document, in key order, a page at a time")
	after := f.String("after", "", "", "with --all: start after this key (to resume)")
	limit := f.Int("limit", "", writer.DefaultReemitLimit, fmt.Sprintf("with --all: documents per request (1 to %d)", writer.MaxReemitKeys))
	asJSON := f.Bool("json", "", false, "machine-readable report")
	access := bindAPIAccess(f, auth.TokenFromEnv)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("backfill takes no arguments (got %q): name documents with --keys k1,k2 or use --all", f.Args())
	}
	keys := splitKeys(*keysFlag)
	switch {
	case *all && len(keys) > 0:
		return errors.New("backfill: give either --keys or --all, not both")
	case !*all && len(keys) == 0:
		return errors.New("backfill: name the documents with --keys k1,k2,... or re-emit every document with --all")
	case !*all && *after != "":
		return errors.New("backfill: -after goes with --all")
	case *limit < 1 || *limit > writer.MaxReemitKeys:
		return fmt.Errorf("backfill: -limit must be from 1 to %d", writer.MaxReemitKeys)
	}
	a, err := access()
	if err != nil {
		return err
	}
	c, err := a.writer(*writerURL)
	if err != nil {
		return err
	}
	rep := backfillReport{Reemitted: []writer.ReemittedDocument{}, NotFound: []string{}}
	if *all {
		err = backfillAll(ctx, c, *after, *limit, &rep)
	} else {
		var res writer.ReemitResponse
		res, err = c.ReemitKeys(ctx, keys)
		rep.Reemitted, rep.NotFound = append(rep.Reemitted, res.Reemitted...), append(rep.NotFound, res.NotFound...)
	}
	err = writerHint(err)
	if *asJSON {
		if jerr := writeJSON(out, rep); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		printBackfill(out, rep, *all)
	}
	if err != nil && rep.Next != "" {
		return fmt.Errorf("%w\nresume with: converge backfill --all -after %q", err, rep.Next)
	}
	return err
}

// backfillAll pages through every document after `after`, with a progress
// line on stderr. On an error or an interruption, rep.Next is the key to
// resume after.
func backfillAll(ctx context.Context, c *writer.Client, after string, limit int, rep *backfillReport) error {
	start := time.Now()
	line := newProgressLine(os.Stderr)
	defer line.Done()
	last := after
	next, err := c.ReemitAll(ctx, after, limit, func(res writer.ReemitResponse) {
		rep.Reemitted = append(rep.Reemitted, res.Reemitted...)
		rep.NotFound = append(rep.NotFound, res.NotFound...)
		if n := len(res.Reemitted); n > 0 {
			last = res.Reemitted[n-1].Key
		}
		line.Update(fmt.Sprintf("backfill: re-emitted %d documents in %v, last %q", len(rep.Reemitted), time.Since(start).Round(time.Second), last))
	})
	if err != nil {
		rep.Next = next
	}
	return err
}

// splitKeys splits a comma-separated list, dropping empty items.
func splitKeys(s string) []string {
	var keys []string
	for _, k := range strings.Split(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

func printBackfill(out io.Writer, rep backfillReport, all bool) {
	what := "the named documents"
	if all {
		what = "every document"
	}
	fmt.Fprintf(out, "re-emitted %d documents (%s): their events are in the outbox again; the relay publishes them and every projection rewrites them\n", len(rep.Reemitted), what)
	for i, d := range rep.Reemitted {
		if i == 20 && len(rep.Reemitted) > 21 {
			fmt.Fprintf(out, "  ... and %d more (--json lists all)\n", len(rep.Reemitted)-20)
			break
		}
		fmt.Fprintf(out, "  %s version %d (event %s, emission %d)\n", d.Key, d.Version, d.EventID, d.Emission)
	}
	if len(rep.NotFound) > 0 {
		fmt.Fprintf(out, "not found (no such document in Postgres): %s\n", strings.Join(rep.NotFound, ", "))
	}
	if rep.Next != "" {
		fmt.Fprintf(out, "stopped after %q\n", rep.Next)
	}
}
