package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph"
)

// graphDoc asks the graph projector what the graph holds about a document.
func graphDoc(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge graph")
	addr := f.String("graph-addr", "CONVERGE_PROJECTOR_GRAPH_ADDR", "127.0.0.1:9104", "the graph projector's metrics address, which serves /v1/graph/{key}")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	var keys []string
	for rest := args; ; {
		if err := f.Parse(rest); err != nil {
			return err
		}
		if f.NArg() == 0 {
			break
		}
		keys = append(keys, f.Arg(0))
		rest = f.Args()[1:]
	}
	if len(keys) != 1 {
		return fmt.Errorf("graph needs one document key: converge graph KEY [--json]")
	}
	u := url.URL{Scheme: "http", Host: *addr, Path: "/v1/graph/" + keys[0]}
	body, err := getJSON(ctx, u.String(), "the graph projector", "projector-graph", "-graph-addr")
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := out.Write(body)
		return err
	}
	var d graph.DocumentJSON
	if err := json.Unmarshal(body, &d); err != nil {
		return fmt.Errorf("graph: unreadable answer: %w", err)
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

// getJSON GETs a projector's read API and returns the body of a 200
// answer; other answers and connection failures are errors that say which
// service to check.
func getJSON(ctx context.Context, u, what, binary, flag string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s at %s does not answer (is %s running? %s): %w", what, req.URL.Host, binary, flag, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}
