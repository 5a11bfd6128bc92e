package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph"
)

// graphDoc asks the graph projector what the graph holds about a
// document, with the token of CONVERGE_TOKEN (the read scope).
func graphDoc(ctx context.Context, args []string, out io.Writer) error {
	return graphDocWith(ctx, args, out, auth.TokenFromEnv)
}

// graphDocWith is graphDoc with the token of token, read once after the
// arguments are parsed.
func graphDocWith(ctx context.Context, args []string, out io.Writer, token tokenSource) error {
	f := config.NewFlags("converge graph")
	addr := graphAddrFlag(f, ", which serves "+graph.DocumentPath+"{key}")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	access := bindAPIAccess(f, token)
	after, wait := bindAfter(f)
	keys, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(keys) != 1 {
		return fmt.Errorf("graph needs one document key: converge graph KEY [--json]")
	}
	a, err := access()
	if err != nil {
		return err
	}
	hc, err := a.httpClient(30 * time.Second)
	if err != nil {
		return err
	}
	d, err := (&graph.Client{Addr: *addr, HTTP: hc, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP,
		After: *after, Wait: *wait}).Document(ctx, keys[0])
	if err != nil {
		return serviceHint[*graph.APIError](err, "projector-graph", "-graph-addr")
	}
	if *asJSON {
		return writeAnswerJSON(out, d)
	}
	state := fmt.Sprintf("version %d", d.Version)
	switch {
	case d.Stub:
		state = "stub (linked to, never written)"
	case d.Deleted:
		state += ", withdrawn"
	}
	fmt.Fprintf(out, "document %s: %s\n", d.Key, state)
	if d.Title != "" {
		fmt.Fprintf(out, "  title:     %s\n", d.Title)
	}
	if d.ContentHash != "" {
		fmt.Fprintf(out, "  hash:      %s\n", d.ContentHash)
	}
	fmt.Fprintf(out, "  tags:      %s\n", list(d.Tags))
	fmt.Fprintf(out, "  links out: %s\n", list(d.LinksOut))
	fmt.Fprintf(out, "  links in:  %s\n", list(d.LinksIn))
	fmt.Fprintf(out, "  chunks:    %d\n", len(d.Chunks))
	for _, c := range d.Chunks {
		fmt.Fprintf(out, "    #%d %s %s\n", c.Ordinal, c.ID, c.ContentHash)
	}
	return nil
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}
