package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// slotStatus is the relay's replication slot as Postgres reports it.
type slotStatus struct {
	Name         string `json:"name"`
	Exists       bool   `json:"exists"`
	Active       bool   `json:"active"`
	ActivePID    *int32 `json:"active_pid,omitempty"`
	ConfirmedLSN string `json:"confirmed_flush_lsn,omitempty"`
	LagBytes     int64  `json:"lag_bytes"`
	WALStatus    string `json:"wal_status,omitempty"`
}

type outboxStatus struct {
	Rows   int64      `json:"rows"`
	Oldest *time.Time `json:"oldest,omitempty"`
}

type streamStatus struct {
	Name      string    `json:"name"`
	Exists    bool      `json:"exists"`
	Messages  uint64    `json:"messages"`
	Bytes     uint64    `json:"bytes"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	LastTime  time.Time `json:"last_time,omitzero"`
	Subjects  uint64    `json:"subjects"`
	Consumers int       `json:"consumers"`
}

// consumerStatus is a projector's (or the writer's ingest) durable consumer.
type consumerStatus struct {
	Stream      string     `json:"stream"`
	Name        string     `json:"name"`
	Pending     uint64     `json:"pending"`     // not yet delivered
	AckPending  int        `json:"ack_pending"` // delivered, not yet acknowledged
	Redelivered int        `json:"redelivered"`
	AckFloorSeq uint64     `json:"ack_floor_seq"`
	LastApplied *time.Time `json:"last_applied_commit_time,omitempty"` // the Postgres commit time of the last event acknowledged in order
	DeadLetters uint64     `json:"dead_letters"`                       // on converge.dlq.<name>
}

type statusReport struct {
	Slot      slotStatus       `json:"slot"`
	Outbox    outboxStatus     `json:"outbox"`
	Streams   []streamStatus   `json:"streams,omitempty"`
	Consumers []consumerStatus `json:"consumers,omitempty"`
	// Rebuilds are those in progress, or interrupted and resumed when
	// their projector starts.
	Rebuilds []rebuild.State `json:"rebuilds,omitempty"`
}

func status(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge status")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL (empty: Postgres only)")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", "converge_relay", "the relay's replication slot")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	rep, err := collectStatus(ctx, *pg, *natsURL, *slot)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, rep)
	}
	printStatus(out, rep)
	return nil
}

func collectStatus(ctx context.Context, pgURL, natsURL, slot string) (statusReport, error) {
	rep := statusReport{Slot: slotStatus{Name: slot}}
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return rep, fmt.Errorf("status: connect postgres: %w", err)
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, `
		SELECT active, active_pid, coalesce(confirmed_flush_lsn::text, ''),
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, coalesce(wal_status, '')
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).
		Scan(&rep.Slot.Active, &rep.Slot.ActivePID, &rep.Slot.ConfirmedLSN, &rep.Slot.LagBytes, &rep.Slot.WALStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return rep, fmt.Errorf("status: read slot: %w", err)
	default:
		rep.Slot.Exists = true
	}
	if err := conn.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox`).Scan(&rep.Outbox.Rows, &rep.Outbox.Oldest); err != nil {
		return rep, fmt.Errorf("status: read outbox (is the schema migrated?): %w", err)
	}
	if natsURL == "" {
		return rep, nil
	}
	nc, err := nats.Connect(natsURL, nats.Name("converge-status"))
	if err != nil {
		return rep, fmt.Errorf("status: connect nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return rep, err
	}
	for _, name := range []string{contract.DocsStream, writer.IngestStream, deadletter.Stream} {
		st := streamStatus{Name: name}
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			rep.Streams = append(rep.Streams, st)
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("status: stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return rep, fmt.Errorf("status: stream %s: %w", name, err)
		}
		st.Exists = true
		st.Messages, st.Bytes, st.FirstSeq, st.LastSeq = info.State.Msgs, info.State.Bytes, info.State.FirstSeq, info.State.LastSeq
		st.LastTime, st.Subjects, st.Consumers = info.State.LastTime, info.State.NumSubjects, info.State.Consumers
		rep.Streams = append(rep.Streams, st)
	}
	consumers, err := collectConsumers(ctx, js)
	rep.Consumers = consumers
	if err != nil {
		return rep, err
	}
	rep.Rebuilds, err = rebuild.InProgress(ctx, js)
	return rep, err
}

// collectConsumers reports the durable consumers of the documents and
// ingest streams, with their dead-letter depth and, for projectors, the
// commit time of the last event they acknowledged in order.
func collectConsumers(ctx context.Context, js jetstream.JetStream) ([]consumerStatus, error) {
	dlq, err := deadletter.Open(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	var out []consumerStatus
	for _, name := range []string{contract.DocsStream, writer.IngestStream} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("status: stream %s: %w", name, err)
		}
		lister := s.ListConsumers(ctx)
		for info := range lister.Info() {
			c := consumerStatus{Stream: name, Name: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending,
				Redelivered: info.NumRedelivered, AckFloorSeq: info.AckFloor.Stream}
			if info.AckFloor.Stream > 0 {
				// The acknowledged message may be gone (history limits):
				// then its commit time is unknown, not an error.
				if m, err := s.GetMsg(ctx, info.AckFloor.Stream); err == nil {
					if t, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime)); err == nil {
						c.LastApplied = &t
					}
				}
			}
			dlqName := info.Name
			if name == writer.IngestStream {
				dlqName = writer.IngestDLQName
			}
			if c.DeadLetters, err = dlq.Count(ctx, dlqName); err != nil {
				return out, fmt.Errorf("status: %w", err)
			}
			out = append(out, c)
		}
		if err := lister.Err(); err != nil {
			return out, fmt.Errorf("status: consumers of %s: %w", name, err)
		}
	}
	return out, nil
}

func printStatus(out io.Writer, rep statusReport) {
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
	fmt.Fprintln(tw)
	oldest := "-"
	if rep.Outbox.Oldest != nil {
		oldest = rep.Outbox.Oldest.Format(time.RFC3339)
	}
	fmt.Fprintf(tw, "OUTBOX\t%d rows\toldest %s\n", rep.Outbox.Rows, oldest)
	if len(rep.Streams) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tSEQ\tSUBJECTS\tCONSUMERS\tLAST")
		for _, s := range rep.Streams {
			if !s.Exists {
				fmt.Fprintf(tw, "%s\tmissing\n", s.Name)
				continue
			}
			last := "-"
			if !s.LastTime.IsZero() {
				last = s.LastTime.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d..%d\t%d\t%d\t%s\n", s.Name, s.Messages, bytesHuman(int64(s.Bytes)), s.FirstSeq, s.LastSeq, s.Subjects, s.Consumers, last)
		}
	}
	if len(rep.Consumers) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "CONSUMER\tSTREAM\tPENDING\tUNACKED\tREDELIVERED\tDEAD LETTERS\tLAST APPLIED COMMIT")
		for _, c := range rep.Consumers {
			last := "-"
			if c.LastApplied != nil {
				last = fmt.Sprintf("%s (%s ago)", c.LastApplied.Format(time.RFC3339), time.Since(*c.LastApplied).Round(time.Second))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", c.Name, c.Stream, c.Pending, c.AckPending, c.Redelivered, c.DeadLetters, last)
		}
	}
	if len(rep.Rebuilds) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "REBUILD	PHASE	INTO	REPLACING	STARTED")
		for _, r := range rep.Rebuilds {
			into := r.Target
			if r.InPlace {
				into += " (in place)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s ago)\n", r.Projector, r.Phase, into, r.Previous,
				r.StartedAt.Format(time.RFC3339), time.Since(r.StartedAt).Round(time.Second))
		}
	}
	_ = tw.Flush()
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
