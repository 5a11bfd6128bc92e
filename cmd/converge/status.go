package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// statusReport is the output of converge status (--json).
type statusReport struct {
	Slot      pipeline.SlotStatus       `json:"slot"`
	Outbox    pipeline.OutboxStatus     `json:"outbox"`
	Inbox     pipeline.InboxStatus      `json:"inbox"`
	Streams   []pipeline.StreamStatus   `json:"streams,omitempty"`
	Consumers []pipeline.ConsumerStatus `json:"consumers,omitempty"`
	// Rebuilds are those in progress, or interrupted and resumed when
	// their projector starts.
	Rebuilds []rebuild.State `json:"rebuilds,omitempty"`
	// CatchUp is the slot's last catch-up from the outbox (the slot found
	// missing after a Postgres failover), nil when none ever happened.
	CatchUp *relay.CatchUpRecord `json:"catch_up,omitempty"`
	// Index is the index projector's live generation and its embedder,
	// when -index-addr is set.
	Index *indexStatus `json:"index,omitempty"`
}

// indexStatus is what the index projector says of its live generation, or
// why it could not be asked.
type indexStatus struct {
	Addr string `json:"addr"`
	*index.Info
	Error string `json:"error,omitempty"`
}

func status(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge status")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL (empty: Postgres only)")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", relay.DefaultSlot, "the relay's replication slot")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	indexAddr := indexAddrFlag(f, ", asked for its live generation's embedder (empty: not asked)")
	natsAuth := natsauth.Flags(f)
	access := bindAPIAccess(f, auth.TokenFromEnv)
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	na, err := natsAuth()
	if err != nil {
		return err
	}
	natsOpts, err := na.Options()
	if err != nil {
		return err
	}
	var ic *index.Client
	if *indexAddr != "" {
		a, err := access()
		if err != nil {
			return err
		}
		hc, err := a.httpClient(5 * time.Second)
		if err != nil {
			return err
		}
		ic = &index.Client{Addr: *indexAddr, HTTP: hc, Token: a.token, InsecurePlainHTTP: a.InsecurePlainHTTP}
	}
	rep, err := collectStatus(ctx, *pg, *natsURL, *slot, natsOpts...)
	if err != nil {
		return err
	}
	if ic != nil {
		rep.Index = askIndex(ctx, ic)
	}
	if *asJSON {
		return writeJSON(out, rep)
	}
	printStatus(out, rep)
	return nil
}

// holdersWatch bounds how long status watches the partitions' leases: a
// holder renewing its lease is told within TTL/3 (its next renewal), one
// that stopped after a whole TTL (lease.DefaultTTL: 3s); a lease of a
// longer TTL is not told.
const holdersWatch = 10 * time.Second

// collectStatus reads the relay's slot and the outbox from Postgres and,
// with a NATS URL, the streams, their consumers (with whether each
// partition's holder renews its lease) and the rebuilds (connected with
// natsOpts: the operator's credentials).
func collectStatus(ctx context.Context, pgURL, natsURL, slot string, natsOpts ...nats.Option) (statusReport, error) {
	rep := statusReport{Slot: pipeline.SlotStatus{Name: slot}}
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return rep, fmt.Errorf("status: connect postgres: %w", err)
	}
	defer conn.Close(context.Background())
	if rep.Slot, err = pipeline.ReadSlot(ctx, conn, slot); err != nil {
		return rep, err
	}
	if rep.Outbox, err = pipeline.ReadOutbox(ctx, conn); err != nil {
		return rep, err
	}
	if rep.Inbox, err = pipeline.ReadInbox(ctx, conn); err != nil {
		return rep, err
	}
	if natsURL == "" {
		return rep, nil
	}
	nc, err := nats.Connect(natsURL, append(natsOpts, nats.Name("converge-status"))...)
	if err != nil {
		return rep, fmt.Errorf("status: connect nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return rep, err
	}
	streams, consumed := pipeline.Deployment(ctx, js, writer.IngestStream, writer.IngestDLQName)
	if rep.Streams, err = pipeline.ReadStreams(ctx, js, streams...); err != nil {
		return rep, err
	}
	if rep.Consumers, err = pipeline.ReadConsumers(ctx, js, consumed...); err != nil {
		return rep, err
	}
	pipeline.CheckHolders(ctx, js, rep.Consumers, holdersWatch)
	if rep.Rebuilds, err = rebuild.InProgress(ctx, js); err != nil {
		return rep, err
	}
	if cu, ok, err := relay.ReadCatchUp(ctx, js, rep.Slot.Name); err == nil && ok {
		rep.CatchUp = &cu
	}
	return rep, nil
}

// askIndex asks the index projector of c for its live generation (c's
// token needs the read scope); an error is reported, not returned: the
// index projector need not run where status does.
func askIndex(ctx context.Context, c *index.Client) *indexStatus {
	st := &indexStatus{Addr: c.Addr}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		st.Error = trustHint(err).Error()
		return st
	}
	st.Info = &info
	return st
}

func printStatus(out io.Writer, rep statusReport) {
	now := clock.Wall().Now() // the ages are of other processes' wall times
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tSTATE\tCONFIRMED LSN\tLAG\tWAL")
	state := "missing (the relay creates it on first start)"
	if rep.Slot.Exists {
		state = "standby/stopped"
		if rep.Slot.Active {
			state = "active"
		}
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", rep.Slot.Name, state, rep.Slot.ConfirmedLSN, bytesHuman(rep.Slot.LagBytes), rep.Slot.WALStatus)
	if cu := rep.CatchUp; cu != nil {
		window := "the whole outbox"
		if cu.Window == "snapshot" {
			window = "rows the mark of " + cu.From.Format(time.RFC3339) + " does not see"
		}
		reason := cu.Reason
		if reason == "" {
			reason = "the slot was missing"
		}
		fmt.Fprintf(tw, "CATCH-UP\t%s: %s; read %s (%d rows): published %d events, %d already stored, %d held by the stream\n",
			cu.At.Format(time.RFC3339), reason, window, cu.Read, cu.Stored, cu.Duplicates, cu.Held)
	}
	fmt.Fprintln(tw)
	oldest := "-"
	if rep.Outbox.Oldest != nil {
		oldest = rep.Outbox.Oldest.Format(time.RFC3339)
	}
	fmt.Fprintf(tw, "OUTBOX\t%d rows\toldest %s\n", rep.Outbox.Rows, oldest)
	oldest = "-"
	if rep.Inbox.OldestPending != nil {
		oldest = rep.Inbox.OldestPending.Format(time.RFC3339)
	}
	fmt.Fprintf(tw, "INBOX\t%d pending\toldest %s\t%d refused (SELECT key, source, row_id, refused_code, refused_message FROM converge_inbox WHERE refused_at IS NOT NULL)\n",
		rep.Inbox.Pending, oldest, rep.Inbox.Refused)
	if len(rep.Streams) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tSEQ\tSUBJECTS\tCONSUMERS\tREPLICAS\tLAST")
		effectsParts := slices.ContainsFunc(rep.Streams, func(s pipeline.StreamStatus) bool {
			return s.Exists && pipeline.Partitioned(s.Name) && s.Name != contract.PartsStream
		})
		for _, s := range rep.Streams {
			if !s.Exists {
				why := ""
				switch s.Name {
				case contract.EventsStream:
					if effectsParts {
						continue // the effects went to their partitions
					}
					why = " (the relay creates it with -effects, for the notifier)"
				case contract.PartsStream:
					continue // only a deployment in partitions has one
				}
				fmt.Fprintf(tw, "%s\tmissing%s\n", s.Name, why)
				continue
			}
			last := "-"
			if !s.LastTime.IsZero() {
				last = s.LastTime.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d..%d\t%d\t%d\t%s\t%s\n", s.Name, s.Messages, bytesHuman(int64(s.Bytes)), s.FirstSeq, s.LastSeq, s.Subjects, s.Consumers, replicasText(s), last)
		}
	}
	if len(rep.Consumers) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "CONSUMER\tSTREAM\tPENDING\tUNACKED\tREDELIVERED\tDEAD LETTERS\tMISSED\tLAST APPLIED COMMIT")
		var holders []pipeline.ConsumerStatus
		for _, c := range rep.Consumers {
			last := "-"
			if c.LastApplied != nil {
				last = fmt.Sprintf("%s (%s ago)", c.LastApplied.Format(time.RFC3339), now.Sub(*c.LastApplied).Round(time.Second))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", c.Name, c.Stream, c.Pending, c.AckPending, c.Redelivered, c.DeadLetters, missed(c), last)
			if pipeline.Partitioned(c.Stream) {
				holders = append(holders, c)
			}
		}
		if len(holders) > 0 {
			fmt.Fprintln(tw)
			fmt.Fprintln(tw, "PARTITION\tHELD BY")
			for _, c := range holders {
				h := c.Holder
				switch {
				case h == "":
					h = "- (nobody: its instance stopped or died; another takes it within the lease's TTL)"
				case c.HolderNotRenewedMs > 0:
					silent := (time.Duration(c.HolderNotRenewedMs) * time.Millisecond).Truncate(100 * time.Millisecond)
					h = fmt.Sprintf("%s (not renewed for %s or more: expired or cut off)", h, silent)
				}
				fmt.Fprintf(tw, "%s\t%s\n", c.Name, h)
			}
		}
	}
	if len(rep.Rebuilds) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "REBUILD	PHASE	INTO	REPLACING	STARTED")
		for _, r := range rep.Rebuilds {
			into := r.Target
			switch {
			case r.Partition != nil:
				into += fmt.Sprintf(" (partition %d of %d, in place)", *r.Partition, r.Partitions)
			case r.InPlace:
				into += " (in place)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s ago)\n", r.Projector, r.Phase, into, r.Previous,
				r.StartedAt.Format(time.RFC3339), now.Sub(r.StartedAt).Round(time.Second))
		}
	}
	if ix := rep.Index; ix != nil {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "INDEX\tGENERATION\tEMBEDDER")
		if ix.Info == nil {
			fmt.Fprintf(tw, "%s\t-\tnot known: %s\n", ix.Addr, ix.Error)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", ix.Addr, ix.Generation, ix.Embedder)
			if ix.WritesRefused != "" {
				fmt.Fprintf(tw, "\tWRITES REFUSED\tthe projector is configured with the embedder %s: run `converge rebuild index`\n", ix.Configured)
			}
			if ix.SearchError != "" {
				fmt.Fprintf(tw, "\tSEARCHES FAIL\t%s\n", ix.SearchError)
			}
		}
	}
	_ = tw.Flush()
}

// missed is a consumer's count of events never received, with its last
// gap: "-" for a consumer that records none.
func missed(c pipeline.ConsumerStatus) string {
	if c.LastGap == nil {
		return "-"
	}
	return fmt.Sprintf("%d (last %d..%d at %s)", c.Missed, c.LastGap.LastFrom, c.LastGap.LastTo, c.LastGap.At.Format(time.RFC3339))
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// replicasText is a stream's replication: its count, and on a cluster its
// leader and each follower (current, or how far behind, or offline).
func replicasText(s pipeline.StreamStatus) string {
	if s.Leader == "" {
		return fmt.Sprint(s.Replicas)
	}
	parts := []string{fmt.Sprintf("%d, leader %s", s.Replicas, s.Leader)}
	for _, f := range s.Followers {
		state := "current"
		switch {
		case f.Offline:
			state = "offline"
		case !f.Current:
			state = fmt.Sprintf("%d behind", f.Lag)
		}
		parts = append(parts, f.Name+" "+state)
	}
	return strings.Join(parts, "; ")
}
