package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
)

// rebuildPollInterval is how often converge rebuild asks for progress.
var rebuildPollInterval = 500 * time.Millisecond

type rebuildReport struct {
	Rebuild rebuild.Status `json:"rebuild"`
	Seconds float64        `json:"seconds"`
	// Verify is the verify of the rebuilt store (absent with -no-verify).
	Verify *verify.Report `json:"verify,omitempty"`
}

// rebuildCmd asks a projector to rebuild its projection from the stream's
// start (blue/green into a fresh generation, or in place after a wipe where
// the store has room for one copy), follows its progress, and verifies the
// result against Postgres. The token of CONVERGE_TOKEN (admin for the
// rebuild, read for the verify) goes with every request to the projector.
func rebuildCmd(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge rebuild")
	indexAddr := indexAddrFlag(f, "")
	graphAddr := graphAddrFlag(f, "")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL (for the verify at the end)")
	noVerify := f.Bool("no-verify", "", false, "do not verify the rebuilt store against Postgres")
	verifyWait := f.Duration("verify-wait", "", 30*time.Second,
		"how long the verify at the end waits for the rebuilt store to catch up with writes still arriving before it reports a disagreement")
	timeout := f.Duration("timeout", "", 0, "give up waiting after this long (0: wait until done; the rebuild goes on in the projector)")
	asJSON := f.Bool("json", "", false, "machine-readable report")
	partition := f.Int("partition", "", -1, "rebuild this partition alone (a projector in partitions): its documents are wiped and filled again from the partitioned stream, in place, while every partition's live writes wait; the verify at the end is of that partition")
	access := bindAPIAccess(f, auth.TokenFromEnv)
	var which string
	if len(args) > 0 && (args[0] == "index" || args[0] == "graph") {
		which, args = args[0], args[1:]
	}
	if err := f.Parse(args); err != nil {
		return err
	}
	if which == "" || f.NArg() > 0 {
		return errors.New("rebuild needs the projection to rebuild: converge rebuild index | converge rebuild graph")
	}
	if *partition < -1 {
		return service.Usage("rebuild: -partition %d: a partition is 0 or more (-1, the default: the whole store)", *partition)
	}
	addr, kind := *indexAddr, verify.Index
	if which == "graph" {
		addr, kind = *graphAddr, verify.Graph
	}
	if !*noVerify {
		if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
			return fmt.Errorf("%w (or -no-verify)", err)
		}
	}
	a, err := access()
	if err != nil {
		return err
	}
	hc, err := a.httpClient(30 * time.Second)
	if err != nil {
		return err
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	var progress io.Writer = os.Stderr
	if *asJSON {
		progress = io.Discard
	}
	start := time.Now()
	st, err := runRebuild(ctx, &rebuild.Client{Addr: addr, HTTP: hc, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP}, *partition, rebuildPollInterval, progress)
	if err != nil {
		return err
	}
	rep := rebuildReport{Rebuild: st, Seconds: time.Since(start).Seconds()}
	if !*noVerify {
		pool, err := pgxpool.New(ctx, *pg)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		defer pool.Close()
		// The rebuilt store is live: writes committed since the rebuild
		// caught up may still be on their way to it, so a disagreement is
		// final only once it has lasted verifyWait. Of one partition's
		// rebuild, that partition is verified.
		deadline := time.Now().Add(*verifyWait)
		// A projector reads its whole store to answer.
		vc, err := a.httpClient(5 * time.Minute)
		if err != nil {
			return err
		}
		side := &verify.Remote{Label: which, Addr: addr, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP, Client: vc}
		for {
			r, err := verify.Compare(ctx, &postgres.Postgres{Pool: pool}, side, kind, verify.DefaultBuckets, nil)
			if err != nil {
				return fmt.Errorf("verify after the rebuild: %w", err)
			}
			r = rebuiltPart(r, st)
			rep.Verify = &r
			if r.Agrees || !time.Now().Before(deadline) {
				break
			}
			fmt.Fprintf(progress, "verify: %d documents differ; verifying again (up to %v more)\n", len(r.Differences), time.Until(deadline).Round(time.Second))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	if *asJSON {
		if err := writeJSON(out, rep); err != nil {
			return err
		}
	} else {
		how := "blue/green into " + st.Target + ", previous generation " + st.Previous + " dropped"
		switch {
		case st.Target == "":
			how = "finished while the projector restarted"
		case st.Partition != nil:
			how = fmt.Sprintf("partition %d of %d, in place in %s, after a wipe of its documents", *st.Partition, st.Partitions, st.Target)
		case st.InPlace:
			how = "in place, after a wipe of " + st.Target
		}
		fmt.Fprintf(out, "%s rebuilt from the stream's start in %.1fs (%s)\n", which, rep.Seconds, how)
		if rep.Verify != nil {
			printVerify(out, verifyReport{Agrees: rep.Verify.Agrees, Stores: []verify.Report{*rep.Verify}})
		}
	}
	if rep.Verify != nil && !rep.Verify.Agrees {
		return errDisagree
	}
	return nil
}

// rebuiltPart is what r, the verify of a whole store, says of what the
// rebuild st rebuilt: of one partition, that partition's differences
// alone, each labelled (the rest of the store was not rebuilt).
func rebuiltPart(r verify.Report, st rebuild.Status) verify.Report {
	if st.Partition == nil || st.Partitions < 2 {
		return r
	}
	part := *st.Partition
	res := verify.Partitions{N: st.Partitions, Only: &part}.Apply(verify.Result{Agrees: r.Agrees, Stores: []verify.Report{r}})
	return res.Stores[0]
}

// runRebuild starts a rebuild on c's projector, of the whole store or of
// partition alone (-1: the whole), or joins the one in progress when it
// covers what was asked, and follows it until it is done, printing
// progress; c's token needs the admin scope.
func runRebuild(ctx context.Context, c *rebuild.Client, partition int, interval time.Duration, progress io.Writer) (rebuild.Status, error) {
	var (
		st  rebuild.Status
		err error
	)
	if partition >= 0 {
		st, _, err = c.StartPartition(ctx, partition)
	} else {
		st, _, err = c.Start(ctx)
	}
	if err != nil {
		return st, err
	}
	switch {
	case st.Partition != nil && partition < 0:
		return st, fmt.Errorf("rebuild %s of partition %d is in progress on %s, not one of the whole store: ask again once it is done", st.ID, *st.Partition, st.Projector)
	case st.Partition != nil && *st.Partition != partition:
		return st, fmt.Errorf("rebuild %s of partition %d is in progress on %s, not one of partition %d: ask again once it is done", st.ID, *st.Partition, st.Projector, partition)
	}
	id := st.ID
	fmt.Fprintf(progress, "rebuild %s of %s: %s\n", id, st.Projector, describeRebuild(st))
	line := newProgressLine(progress)
	defer line.Done()
	st, err = c.Wait(ctx, id, interval, func(st rebuild.Status, err error) {
		if err != nil {
			// The projector may be restarting: it resumes the rebuild.
			line.Printf("rebuild %s: %v; asking again\n", id, err)
			return
		}
		l := fmt.Sprintf("rebuild %s: %-9s applied %d of %d (pending %d)", id, st.Phase, st.AppliedSeq, st.StreamLastSeq, st.Pending)
		if st.Error != "" {
			l += " last error: " + st.Error
		}
		line.Update(l)
	})
	if st.Widened != "" {
		fmt.Fprintf(progress, "rebuild %s became one of the whole store: %s\n", id, st.Widened)
	}
	if err == nil && st.Abandoned != "" {
		err = fmt.Errorf("rebuild %s of partition %v was abandoned: %s", id, partitionLabel(st), st.Abandoned)
	}
	return st, err
}

// partitionLabel is st's partition, "-" for a rebuild of the whole store.
func partitionLabel(st rebuild.Status) string {
	if st.Partition == nil {
		return "-"
	}
	return fmt.Sprintf("%d of %d", *st.Partition, st.Partitions)
}

func describeRebuild(st rebuild.Status) string {
	if st.Partition != nil {
		return fmt.Sprintf("partition %d of %d in place (wipe its documents, then fill them from its first event), live writes of every partition held back until it has caught up", *st.Partition, st.Partitions)
	}
	if st.InPlace {
		return "in place (wipe, then fill from the stream's start), live writes held back until it has caught up"
	}
	return fmt.Sprintf("blue/green into %s while %s stays live", st.Target, st.Previous)
}
