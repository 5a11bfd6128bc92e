package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/internal/writer"
)

// errDisagree makes converge exit non-zero when a store disagrees.
var errDisagree = errors.New("the stores do not agree with Postgres")

// verifyReport is the report of converge verify (and of the demo's and
// the rebuild's verify), its --json output.
type verifyReport = verify.Result

// verifyCmd compares each projection with Postgres by bucket digests and
// reports every differing document. The token of CONVERGE_TOKEN goes to
// the projectors (read) and, with --repair, to the writer (admin).
func verifyCmd(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge verify")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	indexAddr := indexAddrFlag(f, "")
	graphAddr := graphAddrFlag(f, "")
	stores := f.String("stores", "", "index,graph", "the projections to verify, comma-separated")
	buckets := f.Int("buckets", "", verify.DefaultBuckets, "number of digest buckets")
	asJSON := f.Bool("json", "", false, "machine-readable report")
	repair := f.Bool("repair", "", false, "re-emit, through the writer, every document Postgres can repair, then verify again until the stores agree")
	writerURL := f.String("writer-url", envWriterURL, "http://127.0.0.1:8080", "with --repair: the writer's API")
	repairTimeout := f.Duration("repair-timeout", "", 2*time.Minute, "with --repair: how long to wait for the stores to agree")
	partitions := f.Int("partitions", "", 0, "the projectors run in this many partitions: label each difference with its document's partition")
	partition := f.Int("partition", "", -1, "with -partitions: verify this partition alone (both sides are still read whole; the other partitions' differences are left out)")
	access := bindAPIAccess(f, auth.TokenFromEnv)
	watch := bindWatch(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	parts := verify.Partitions{N: *partitions}
	if *partition >= 0 {
		parts.Only = partition
	}
	if err := parts.Validate(); err != nil {
		return service.Usage("%v", err)
	}
	if *watch.on && parts.N > 0 {
		return service.Usage("-watch compares the whole stores; -partitions labels a single verify's differences")
	}
	if *watch.on {
		if *asJSON {
			return service.Usage("-watch reports on /v1/verify/status and in its log, not with --json")
		}
		if err := watch.validate(*buckets); err != nil {
			return err
		}
	}
	a, err := access()
	if err != nil {
		return err
	}
	var wc *writer.Client
	if *repair {
		if wc, err = a.writer(*writerURL); err != nil {
			return err
		}
		if *repairTimeout <= 0 {
			return service.Usage("-repair-timeout must be positive")
		}
	}
	stored, err := storeSides(*stores, *indexAddr, *graphAddr)
	if err != nil {
		return err
	}
	// A projector reads its whole store to answer.
	hc, err := a.httpClient(5 * time.Minute)
	if err != nil {
		return err
	}
	a.reach(stored, hc)
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	if *buckets < 1 || *buckets > verify.MaxBuckets {
		return service.Usage("-buckets must be from 1 to %d", verify.MaxBuckets)
	}
	pool, err := pgxpool.New(ctx, *pg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	truth := &postgres.Postgres{Pool: pool}
	if *watch.on {
		var re verify.Reemitter
		if wc != nil {
			re = hintedWriter{wc}
		}
		return runWatch(ctx, watch, truth, stored, *buckets, re, out)
	}
	rep, err := runVerify(ctx, truth, stored, *buckets, !*asJSON)
	if err != nil {
		return err
	}
	rep = parts.Apply(rep)
	if *repair && !rep.Agrees {
		if !*asJSON {
			printVerify(out, rep)
		}
		rep, err = verify.Repair(ctx, hintedWriter{wc}, truth, stored, rep, verify.RepairConfig{Buckets: *buckets, Timeout: *repairTimeout, Partitions: parts,
			Progress: printRepairProgress(progressOut(!*asJSON, out), wc.URL(), *repairTimeout)})
		if err != nil {
			return err
		}
	}
	if *asJSON {
		if err := writeJSON(out, rep); err != nil {
			return err
		}
	} else {
		printVerify(out, rep)
		if rep.Repair != nil {
			printRepaired(out, rep.Repair)
		}
		if note := handedOverNote(ctx, pool); note != "" {
			fmt.Fprintln(out, note)
		}
	}
	if !rep.Agrees {
		return errDisagree
	}
	return nil
}

// handedOverNote says, when converge_inbox holds rows the writers have
// not applied yet (documents handed over in SQL, changed rows of mapped
// tables) or refused, that the stores were compared with Postgres's
// documents as they are, without those; "" when there are none (or the
// schema has no inbox).
func handedOverNote(ctx context.Context, pool *pgxpool.Pool) string {
	var pending, refused int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE refused_at IS NULL), count(*) FILTER (WHERE refused_at IS NOT NULL)
		FROM converge_inbox`).Scan(&pending, &refused); err != nil || pending+refused == 0 {
		return ""
	}
	note := fmt.Sprintf("note: converge_inbox holds %d handed-over rows not applied yet", pending)
	if refused > 0 {
		note += fmt.Sprintf(" and %d refused (SELECT * FROM converge_inbox WHERE refused_at IS NOT NULL)", refused)
	}
	return note + ": the stores were compared with Postgres's documents without them"
}

// storeSides are the projections of list (-stores), each asked of its
// projector. An unknown name is a usage error: verifying fewer stores than
// asked for would let verify succeed on a typo.
func storeSides(list, indexAddr, graphAddr string) ([]verify.Projection, error) {
	var out []verify.Projection
	for _, s := range strings.Split(list, ",") {
		name := strings.TrimSpace(s)
		var side verify.Projection
		switch name {
		case "index":
			side = verify.Projection{Kind: verify.Index, Side: &verify.Remote{Label: "index", Addr: indexAddr}}
		case "graph":
			side = verify.Projection{Kind: verify.Graph, Side: &verify.Remote{Label: "graph", Addr: graphAddr}}
		case "":
			continue
		default:
			return nil, service.Usage("-stores: unknown store %q: want index or graph", name)
		}
		if slices.ContainsFunc(out, func(o verify.Projection) bool { return o.Kind == side.Kind }) {
			continue
		}
		out = append(out, side)
	}
	if len(out) == 0 {
		return nil, service.Usage("-stores: no store to verify: want index, graph or index,graph")
	}
	return out, nil
}

// bothSides are the index and the graph, asked of their projectors at
// these addresses with token.
func bothSides(indexAddr, graphAddr, token string) []verify.Projection {
	return apiAccess{token: token}.reach([]verify.Projection{
		{Kind: verify.Index, Side: &verify.Remote{Label: "index", Addr: indexAddr}},
		{Kind: verify.Graph, Side: &verify.Remote{Label: "graph", Addr: graphAddr}},
	}, nil)
}

// reach makes the sides asked of a projector send a's token with hc (nil:
// the sides' default client), and returns them.
func (a apiAccess) reach(sides []verify.Projection, hc *http.Client) []verify.Projection {
	for _, s := range sides {
		if r, ok := s.Side.(*verify.Remote); ok {
			r.Token, r.InsecurePlainHTTP, r.Client = a.token, a.InsecurePlainHTTP, hc
		}
	}
	return sides
}

// runVerify is [verify.Run], showing on stderr, with progress, how far
// the comparison of each store's differing buckets is.
func runVerify(ctx context.Context, truth verify.Side, stores []verify.Projection, buckets int, progress bool) (verifyReport, error) {
	var show func(store string, done, total int)
	var line *progressLine
	if progress {
		current := ""
		show = func(store string, done, total int) {
			if line == nil || store != current {
				if line != nil {
					line.Done()
				}
				line, current = newProgressLine(os.Stderr), store
			}
			line.Update(fmt.Sprintf("%s: compared %d/%d differing buckets", store, done, total))
			if done == total {
				line.Done()
			}
		}
	}
	rep, err := verify.Run(ctx, truth, stores, buckets, show)
	if line != nil {
		line.Done()
	}
	return rep, err
}

// printEmbedder names the embedder of the index's live generation.
func printEmbedder(out io.Writer, r verify.Report) {
	if r.Embedder != nil {
		fmt.Fprintf(out, "%-6s live generation's vectors: embedder %s\n", "", r.Embedder)
	}
}

func printVerify(out io.Writer, rep verifyReport) {
	for _, r := range rep.Stores {
		if r.Partition != nil {
			whole := fmt.Sprintf("the whole store: %d of %d buckets differ", r.DifferingBuckets, r.Buckets)
			if r.Agrees {
				fmt.Fprintf(out, "%-6s agrees with Postgres on partition %d of %d (%s)\n", r.Store, *r.Partition, r.Partitions, whole)
				printEmbedder(out, r)
				continue
			}
			fmt.Fprintf(out, "%-6s DISAGREES on partition %d of %d: %d documents differ (%s)\n", r.Store, *r.Partition, r.Partitions, len(r.Differences), whole)
			printDifferences(out, r)
			continue
		}
		if r.Agrees {
			fmt.Fprintf(out, "%-6s agrees with Postgres on all %d documents (%d of %d bucket digests equal)\n", r.Store, r.Documents, r.Buckets, r.Buckets)
			printEmbedder(out, r)
			continue
		}
		counts := map[string]int{}
		for _, d := range r.Differences {
			counts[d.Problem]++
		}
		var kinds []string
		for k, n := range counts {
			kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
		}
		slices.Sort(kinds)
		fmt.Fprintf(out, "%-6s DISAGREES: %d documents differ (%s); %d of %d buckets differ; Postgres %d documents, %s %d\n",
			r.Store, len(r.Differences), strings.Join(kinds, ", "), r.DifferingBuckets, r.Buckets, r.Documents, r.Store, r.StoreDocuments)
		if r.Partitions > 0 {
			byPart := map[int]int{}
			for _, d := range r.Differences {
				if d.Partition != nil {
					byPart[*d.Partition]++
				}
			}
			var parts []string
			for _, p := range slices.Sorted(maps.Keys(byPart)) {
				parts = append(parts, fmt.Sprintf("%d in partition %d", byPart[p], p))
			}
			fmt.Fprintf(out, "%-6s by partition (of %d): %s\n", "", r.Partitions, strings.Join(parts, ", "))
		}
		printDifferences(out, r)
	}
}

// printDifferences lists r's differences, the first 50.
func printDifferences(out io.Writer, r verify.Report) {
	printEmbedder(out, r)
	for i, d := range r.Differences {
		if i == 50 {
			fmt.Fprintf(out, "  ... and %d more (--json lists all)\n", len(r.Differences)-50)
			break
		}
		part := ""
		if d.Partition != nil {
			part = fmt.Sprintf(" (partition %d)", *d.Partition)
		}
		fmt.Fprintf(out, "  %-16s %s%s: %s\n", d.Problem, d.Key, part, d.Detail)
	}
}
