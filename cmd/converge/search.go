package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
)

// search asks the index projector (which embeds the query with the
// index's own embedder) for the chunks nearest to a text, with the token
// of CONVERGE_TOKEN (the read scope).
func search(ctx context.Context, args []string, out io.Writer) error {
	return searchWith(ctx, args, out, auth.TokenFromEnv)
}

// tokenSource gives the bearer token a command sends: auth.TokenFromEnv
// on the command line, the stack's own in the demo.
type tokenSource func() (string, error)

// searchWith is search with the token of token, read once after the
// arguments are parsed.
func searchWith(ctx context.Context, args []string, out io.Writer, token tokenSource) error {
	f := config.NewFlags("converge search")
	addr := indexAddrFlag(f, ", which serves "+index.SearchPath)
	k := f.Int("k", "", 10, "number of results")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	access := bindAPIAccess(f, token)
	after, wait := bindAfter(f)
	// Flags may come before or after the query.
	words, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	query := strings.Join(words, " ")
	if query == "" {
		return fmt.Errorf("search needs a query: converge search \"some text\" [-k N]")
	}
	a, err := access()
	if err != nil {
		return err
	}
	hc, err := a.httpClient(30 * time.Second)
	if err != nil {
		return err
	}
	res, err := (&index.Client{Addr: *addr, HTTP: hc, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP,
		After: *after, Wait: *wait}).Search(ctx, query, *k)
	if err != nil {
		return fmt.Errorf("search: %w", serviceHint[*index.APIError](err, "projector-index", "-index-addr"))
	}
	if *asJSON {
		return writeAnswerJSON(out, res)
	}
	if len(res.Results) == 0 {
		fmt.Fprintln(out, "no results (is the index empty?)")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCORE\tKEY\tVERSION\tCHUNK\tTEXT")
	for _, r := range res.Results {
		fmt.Fprintf(tw, "%.4f\t%s\t%d\t%d\t%s\n", r.Score, r.Key, r.Version, r.Ordinal, snippet(r.Text, 80))
	}
	return tw.Flush()
}

func snippet(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "..."
}
