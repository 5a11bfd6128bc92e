package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/writer"
)

const dlqUsage = `converge dlq: inspect and redrive dead letters

Every converge consumer (the writer's ingest consumer "ingest", the projectors
"index" and "graph" and their rebuilds "index-rebuild" and "graph-rebuild",
the notifier "notifier") puts a message it can never process into the stream
CONVERGE_DLQ on converge.dlq.<consumer>, with the reason in headers.

Usage:
  converge dlq list [--json]
        per consumer: the number of dead letters, the oldest and newest, and
        the counts by code (codes are counted over at most 100000 dead letters)
  converge dlq show CONSUMER [--limit N] [--json]
        the dead letters of one consumer, oldest first: sequence, time, code,
        reason, the original subject, stream and sequence, and the payload
  converge dlq redrive CONSUMER (--seq N[,N...] ... | --all) [--dry-run] [-writer-url URL]
        put dead letters back, so that the consumer processes them again once
        the cause is fixed; each is deleted from CONVERGE_DLQ only after its
        redrive was acknowledged, and each line says how it went back:

        re-emitted: a dead letter of CONVERGE_DOCS (converge.docs.>: index,
          graph, their rebuilds, notifier). The relay alone publishes to that
          stream, so the redrive asks the writer (-writer-url, env
          CONVERGE_WRITER_URL, default http://127.0.0.1:8080) to re-emit the
          document: the writer puts its current version's event into the
          outbox and the relay publishes it, as converge backfill does. The
          dead letter is deleted once the writer acknowledged its key. The
          consumer then applies the document's latest state (which may be a
          newer version than the dead letter's), which is what a projection
          needs. A dead letter whose data names no document, or whose
          document the writer does not find or cannot reproduce, is kept
          and reported, and the command exits non-zero.
        republished: a dead letter of CONVERGE_INGEST (converge.ingest.>:
          ingest) goes back on its original subject, for the writer, with the
          original's data and headers, without the Converge-Dlq-* ones, and
          the Nats-Msg-Id redrive-<dlq seq>-<data hash>: a redrive retried
          after a crash between the republish and the delete is dropped by
          the stream's duplicate window and stored once. The dead letter is
          deleted once JetStream acknowledged the republish.

Redrive is an operator action: fix the cause first (converge dlq show says
it). A re-emission reaches every consumer of CONVERGE_DOCS, not only the one
that dead-lettered it. That is harmless: a store's freshness guard skips a
version older than the one it holds, and the same version again is applied
idempotently.

The notifier: a re-emitted event is one the notifier recognises as such
and, unless it runs with -notify-replayed (CONVERGE_NOTIFIER_NOTIFY_REPLAYED),
skips (counted as skipped "reemission"): without it, redriving a notifier
dead letter sends no webhook, and deletes the dead letter all the same.
With it, the notifier sends the notification of the document's current
version, with that version's Idempotency-Key, unless it was sent already
within the window: the dead letter's own notification if the document has
not changed since (its record was reset when it was dead-lettered), else
the newer version's, which it has most likely sent already. It then also
notifies every other re-emission (converge backfill, verify --repair) and
events older than the window.

Every subcommand takes -nats-url (env CONVERGE_NATS_URL).
`

// dlqCmd is `converge dlq`.
func dlqCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(out, dlqUsage)
		return nil
	}
	switch args[0] {
	case "list":
		return dlqList(ctx, args[1:], out)
	case "show":
		return dlqShow(ctx, args[1:], out)
	case "redrive":
		return dlqRedrive(ctx, args[1:], out)
	default:
		return fmt.Errorf("unknown dlq subcommand %q: use list, show or redrive\n\n%s", args[0], dlqUsage)
	}
}

// parseInterspersed parses flags that may come before or after the
// positional arguments, and returns those.
func parseInterspersed(f *config.Flags, args []string) ([]string, error) {
	var pos []string
	for rest := args; ; {
		if err := f.Parse(rest); err != nil {
			return nil, err
		}
		if f.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, f.Arg(0))
		rest = f.Args()[1:]
	}
}

// connectJetStream connects to NATS at url, named name, with the
// credentials the command's flags gave and the extra options. The caller
// closes the connection.
func connectJetStream(url, name string, credentials func() (natsauth.ClientConfig, error), extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	na, err := credentials()
	if err != nil {
		return nil, nil, err
	}
	opts, err := na.Options()
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url, append(append(opts, nats.Name(name)), extra...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// openDLQ connects to NATS and opens the dead-letter queue. The caller
// closes the connection.
func openDLQ(ctx context.Context, url string, credentials func() (natsauth.ClientConfig, error)) (*nats.Conn, *deadletter.Queue, error) {
	nc, js, err := connectJetStream(url, "converge-dlq", credentials)
	if err != nil {
		return nil, nil, fmt.Errorf("dlq: %w", err)
	}
	q, err := deadletter.Open(ctx, js)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("dlq: %w", err)
	}
	return nc, q, nil
}

func dlqList(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq list")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	natsAuth := natsauth.Flags(f)
	asJSON := f.Bool("json", "", false, "machine-readable output")
	pos, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("dlq list takes no arguments, got %q", pos)
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	nc, q, err := openDLQ(ctx, *natsURL, natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	sum, err := q.Summarize(ctx, deadletter.DefaultScanCap)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	if *asJSON {
		return writeJSON(out, sum)
	}
	printDLQList(out, sum)
	return nil
}

func printDLQList(out io.Writer, sum deadletter.Summary) {
	if !sum.Exists {
		fmt.Fprintf(out, "no dead letters: stream %s does not exist (consumers create it when they start)\n", sum.Stream)
		return
	}
	if len(sum.Consumers) == 0 {
		fmt.Fprintf(out, "no dead letters in %s\n", sum.Stream)
		return
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tDEAD LETTERS\tOLDEST\tNEWEST\tCODES")
	for _, c := range sum.Consumers {
		codes := make([]string, 0, len(c.Codes))
		for _, code := range slices.Sorted(maps.Keys(c.Codes)) {
			codes = append(codes, fmt.Sprintf("%s=%d", code, c.Codes[code]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", c.Consumer, c.DeadLetters, timeOrDash(c.Oldest), timeOrDash(c.Newest), strings.Join(codes, " "))
	}
	_ = tw.Flush()
	if sum.Capped {
		fmt.Fprintf(out, "codes counted over the first %d dead letters only (the scan stops there)\n", sum.Scanned)
	}
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dlqShow(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq show")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	natsAuth := natsauth.Flags(f)
	limit := f.Int("limit", "", 100, "show at most this many dead letters, oldest first (0: all)")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	pos, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("dlq show needs one consumer: converge dlq show CONSUMER [--limit N] [--json]")
	}
	if *limit < 0 {
		return fmt.Errorf("dlq show: --limit %d: want 0 (all) or more", *limit)
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	nc, q, err := openDLQ(ctx, *natsURL, natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	page, err := q.Read(ctx, pos[0], *limit)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	if *asJSON {
		return writeJSON(out, page)
	}
	fmt.Fprintf(out, "dead letters of %s (%s): %d", page.Consumer, page.Subject, page.Total)
	if page.Truncated {
		fmt.Fprintf(out, ", the oldest %d shown (--limit)", len(page.DeadLetters))
	}
	fmt.Fprintln(out)
	for _, e := range page.DeadLetters {
		fmt.Fprintf(out, "\n#%d  %s  %s\n", e.Seq, e.Time.Format(time.RFC3339), orDash(e.Code))
		orig := orDash(e.OriginalSubj)
		if e.OriginalStream != "" {
			orig += fmt.Sprintf(" (%s seq %d)", e.OriginalStream, e.OriginalSeq)
		}
		fmt.Fprintf(out, "  original: %s\n", orig)
		fmt.Fprintf(out, "  payload:  %s\n", e.Payload)
		fmt.Fprintf(out, "  reason:   %s\n", orDash(e.Reason))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// seqList is a repeatable flag of stream sequences, each value one or
// several separated by commas.
type seqList []uint64

func (l *seqList) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ",")
}

func (l *seqList) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("%q is not a stream sequence", p)
		}
		*l = append(*l, n)
	}
	return nil
}

func dlqRedrive(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq redrive")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	natsAuth := natsauth.Flags(f)
	writerURL := f.String("writer-url", envWriterURL, "http://127.0.0.1:8080", "the writer's API, which re-emits the documents of CONVERGE_DOCS's dead letters")
	var seqs seqList
	f.Var(&seqs, "seq", "redrive the dead letter with this CONVERGE_DLQ sequence (repeatable, or comma-separated)")
	all := f.Bool("all", "", false, "redrive every dead letter of the consumer")
	dryRun := f.Bool("dry-run", "", false, "say what would be redriven, change nothing")
	access := bindAPIAccess(f, auth.TokenFromEnv)
	pos, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("dlq redrive needs one consumer: converge dlq redrive CONSUMER (--seq N ... | --all) [--dry-run] [-writer-url URL]")
	}
	switch {
	case len(seqs) == 0 && !*all:
		return errors.New("dlq redrive: say which dead letters: --seq N (repeatable) or --all; `converge dlq show` lists them")
	case len(seqs) > 0 && *all:
		return errors.New("dlq redrive: --seq and --all exclude each other")
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	a, err := access()
	if err != nil {
		return err
	}
	wc, err := a.writer(*writerURL)
	if err != nil {
		return err
	}
	consumer := pos[0]
	nc, q, err := openDLQ(ctx, *natsURL, natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	var (
		kept, reemitted, republished int
		notified                     bool // a notifier's dead letter is (or would be) re-emitted
	)
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: consumer, Seqs: seqs, All: *all, DryRun: *dryRun, Writer: writerReemitter{wc}}, func(r deadletter.Redriven) {
		if r.Kept != "" {
			kept++
			if *dryRun {
				fmt.Fprintf(out, "would keep #%d (%s): %s; %s\n", r.Seq, r.Subject, r.Kept, r.Payload)
			} else {
				fmt.Fprintf(out, "kept #%d (%s): %s\n", r.Seq, r.Subject, r.Kept)
			}
			return
		}
		if r.Path == deadletter.Reemit {
			reemitted++
			notified = notified || consumer == natsauth.NotifierName || r.Code == notifier.DeadLetterCode
		} else {
			republished++
		}
		switch {
		case *dryRun && r.Path == deadletter.Reemit:
			fmt.Fprintf(out, "would redrive #%d to %s (%s), re-emitted: the writer's current version of %q; %s\n", r.Seq, r.Subject, orDash(r.Stream), r.Key, r.Payload)
		case *dryRun:
			fmt.Fprintf(out, "would redrive #%d to %s (%s), republished: %s\n", r.Seq, r.Subject, orDash(r.Stream), r.Payload)
		case r.Path == deadletter.Reemit:
			newer := ""
			if r.Payload.Event && r.Version > r.Payload.Version {
				newer = fmt.Sprintf(", newer than the dead letter's version %d", r.Payload.Version)
			}
			fmt.Fprintf(out, "redriven #%d to %s, re-emitted: %q version %d (emission %d%s)\n", r.Seq, r.Subject, r.Key, r.Version, r.Emission, newer)
		case r.Duplicate:
			fmt.Fprintf(out, "redriven #%d to %s (%s seq %d), republished, already there from an earlier redrive\n", r.Seq, r.Subject, r.Stream, r.StreamSeq)
		default:
			fmt.Fprintf(out, "redriven #%d to %s (%s seq %d), republished\n", r.Seq, r.Subject, r.Stream, r.StreamSeq)
		}
	})
	if notified {
		fmt.Fprintln(out, notifierNote)
	}
	if err != nil {
		if n > 0 {
			fmt.Fprintf(out, "stopped after %d redriven\n", n)
		}
		return fmt.Errorf("dlq: %w", err)
	}
	if *dryRun {
		fmt.Fprintf(out, "dry run: %d dead letters of %s would be redriven (%d re-emitted, %d republished); nothing changed\n", n, consumer, reemitted, republished)
		if kept > 0 {
			fmt.Fprintf(out, "dry run: %d would be kept\n", kept)
		}
		return nil
	}
	fmt.Fprintf(out, "%d dead letters of %s redriven and deleted from %s (%d re-emitted, %d republished)\n", n, consumer, deadletter.Stream, reemitted, republished)
	if kept > 0 {
		return fmt.Errorf("dlq: %d dead letters of %s kept in %s (see above): repair their documents (converge backfill --keys, converge replay %s) or fix the cause and redrive again", kept, consumer, deadletter.Stream, consumer)
	}
	return nil
}

// notifierNote says what the re-emission of a notifier's dead letter does.
const notifierNote = `note: the notifier skips a re-emitted event unless it runs with -notify-replayed (CONVERGE_NOTIFIER_NOTIFY_REPLAYED): without it, no webhook is sent for these, and their dead letters are deleted all the same. With it, it sends the notification of each document's current version unless already sent within the window (see converge dlq help)`

// writerReemitter is the writer's client as the dead-letter queue's
// [deadletter.Reemitter].
type writerReemitter struct{ c *writer.Client }

func (w writerReemitter) ReemitKeys(ctx context.Context, keys []string) (deadletter.Reemission, error) {
	res, err := w.c.ReemitKeys(ctx, keys)
	out := deadletter.Reemission{NotFound: res.NotFound}
	for _, d := range res.Reemitted {
		out.Reemitted = append(out.Reemitted, deadletter.ReemittedKey{Key: d.Key, Version: d.Version, EventID: d.EventID, Emission: d.Emission})
	}
	if errors.Is(err, docstore.ErrNotReproducible) {
		return out, notReproducible{err}
	}
	return out, writerHint(err)
}

// notReproducible is the writer's refusal of a document it cannot
// reproduce, as the dead-letter queue classifies it.
type notReproducible struct{ error }

func (e notReproducible) Is(target error) bool { return target == deadletter.ErrNotReproducible }
func (e notReproducible) Unwrap() error        { return e.error }
