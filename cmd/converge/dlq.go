package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/pkg/contract"
)

const dlqUsage = `converge dlq: inspect and redrive dead letters

Every converge consumer (the writer's ingest consumer "ingest", the projectors
"index" and "graph") puts a message it can never process into the stream
CONVERGE_DLQ on converge.dlq.<consumer>, with the reason in headers.

Usage:
  converge dlq list [--json]
        per consumer: the number of dead letters, the oldest and newest, and
        the counts by code (codes are counted over at most 100000 dead letters)
  converge dlq show CONSUMER [--limit N] [--json]
        the dead letters of one consumer, oldest first: sequence, time, code,
        reason, the original subject, stream and sequence, and the payload
  converge dlq redrive CONSUMER (--seq N[,N...] ... | --all) [--dry-run]
        republish dead letters to their original subject, so that the consumer
        processes them again once the cause is fixed; each is deleted from
        CONVERGE_DLQ only after JetStream acknowledged its republish

Redrive is an operator action: fix the cause first (converge dlq show says
it). A projector's dead letter goes back into CONVERGE_DOCS, the relay's
stream, where every projector reads it, not only the one that dead-lettered
it. That is harmless: a store's freshness guard skips a version older than
the one it holds, and the same version again is applied idempotently, so a
stale redriven event changes nothing. It does take one of the places the
stream keeps per document (the relay's -stream-history, default 4), so the
newest version stays in the stream for a rebuild only while that is above 1.
An ingest dead letter goes back into CONVERGE_INGEST, for the writer.

The republished message keeps the original's data and headers, without the
Converge-Dlq-* ones, with the Nats-Msg-Id redrive-<dlq seq>-<data hash>: a
redrive retried after a crash between the republish and the delete is
dropped by the original stream's duplicate window and stored once (beyond
the window, consumers are idempotent).

Every subcommand takes -nats-url (env CONVERGE_NATS_URL).
`

// dlqScanCap bounds the dead letters list reads to count codes.
const dlqScanCap = 100_000

// dlqIdle ends a scan that receives nothing for this long: the dead letters
// it expected were deleted meanwhile.
const dlqIdle = 5 * time.Second

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

// connectDLQ connects to NATS and returns the dead-letter stream, nil if it
// does not exist (no consumer has started yet).
func connectDLQ(ctx context.Context, url string) (*nats.Conn, jetstream.JetStream, jetstream.Stream, error) {
	nc, err := nats.Connect(url, nats.Name("converge-dlq"))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dlq: connect nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("dlq: %w", err)
	}
	s, err := js.Stream(ctx, deadletter.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nc, js, nil, nil
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("dlq: stream %s: %w", deadletter.Stream, err)
	}
	return nc, js, s, nil
}

// dlqSubjects returns the number of dead letters of each consumer that has
// any, and the stream's last sequence.
func dlqSubjects(ctx context.Context, s jetstream.Stream) (map[string]uint64, uint64, error) {
	counts := map[string]uint64{}
	if s == nil {
		return counts, 0, nil
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(contract.DLQSubjectPrefix+">"))
	if err != nil {
		return nil, 0, fmt.Errorf("dlq: stream %s: %w", deadletter.Stream, err)
	}
	for subj, n := range info.State.Subjects {
		if name, ok := strings.CutPrefix(subj, contract.DLQSubjectPrefix); ok && n > 0 {
			counts[name] = n
		}
	}
	return counts, info.State.LastSeq, nil
}

// unknownConsumer is the error for a consumer without dead letters.
// openConsumerDLQ connects to the dead-letter stream and checks that
// consumer has dead letters; it returns the stream's dead letters counted
// by consumer and its last sequence. The caller closes nc.
func openConsumerDLQ(ctx context.Context, natsURL, consumer string) (*nats.Conn, jetstream.JetStream, jetstream.Stream, map[string]uint64, uint64, error) {
	nc, js, s, err := connectDLQ(ctx, natsURL)
	if err != nil {
		return nil, nil, nil, nil, 0, err
	}
	counts, lastSeq, err := dlqSubjects(ctx, s)
	if err == nil && counts[consumer] == 0 {
		err = unknownConsumer(consumer, counts)
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, nil, 0, err
	}
	return nc, js, s, counts, lastSeq, nil
}

func unknownConsumer(consumer string, counts map[string]uint64) error {
	if len(counts) == 0 {
		return fmt.Errorf("dlq: no dead letters for consumer %q: no consumer has any", consumer)
	}
	return fmt.Errorf("dlq: no dead letters for consumer %q; consumers with dead letters: %s",
		consumer, strings.Join(slices.Sorted(maps.Keys(counts)), ", "))
}

// scanDLQ calls fn with each dead letter on filter in stream order, up to
// the stream's last sequence when the scan began (dead letters arriving
// meanwhile, such as a redriven message dead-lettered again, are left for
// the next run), and at most limit of them (0: no limit). It reports
// whether the limit left some unread. It reads through an ordered
// consumer, which changes nothing in the stream.
func scanDLQ(ctx context.Context, js jetstream.JetStream, filter string, lastSeq uint64, limit int, headersOnly bool, fn func(jetstream.Msg, *jetstream.MsgMetadata) error) (truncated bool, err error) {
	if lastSeq == 0 {
		return false, nil
	}
	cons, err := js.OrderedConsumer(ctx, deadletter.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		HeadersOnly:    headersOnly,
		// Removed below; this is for a scan that dies first.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return false, fmt.Errorf("dlq: read %s: %w", filter, err)
	}
	batch := 256
	if limit > 0 && limit < batch {
		batch = limit
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(batch))
	if err != nil {
		return false, fmt.Errorf("dlq: read %s: %w", filter, err)
	}
	defer func() {
		it.Stop()
		// An ordered consumer is removed only when inactive; an operator
		// looking at the stream's consumers should not see the scan's.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = js.DeleteConsumer(dctx, deadletter.Stream, info.Name)
			cancel()
		}
	}()
	for n := 0; ; {
		nctx, cancel := context.WithTimeout(ctx, dlqIdle)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return false, nil
			}
			return false, fmt.Errorf("dlq: read %s: %w", filter, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return false, fmt.Errorf("dlq: read %s: %w", filter, err)
		}
		if meta.Sequence.Stream > lastSeq {
			return false, nil
		}
		if err := fn(m, meta); err != nil {
			return false, err
		}
		n++
		if meta.NumPending == 0 || meta.Sequence.Stream >= lastSeq {
			return false, nil
		}
		if limit > 0 && n >= limit {
			return true, nil
		}
	}
}

// dlqConsumerSummary is one consumer's line of `converge dlq list`.
type dlqConsumerSummary struct {
	Consumer    string            `json:"consumer"`
	Subject     string            `json:"subject"`
	DeadLetters uint64            `json:"dead_letters"`
	Oldest      time.Time         `json:"oldest,omitzero"`
	Newest      time.Time         `json:"newest,omitzero"`
	Codes       map[string]uint64 `json:"codes"`
}

// dlqListReport is the answer of `converge dlq list`.
type dlqListReport struct {
	Stream    string               `json:"stream"`
	Exists    bool                 `json:"exists"`
	Consumers []dlqConsumerSummary `json:"consumers"`
	// Scanned is the number of dead letters read to count codes; Capped
	// says the scan stopped at its cap, so codes cover only those.
	Scanned uint64 `json:"scanned"`
	Capped  bool   `json:"capped"`
}

func dlqList(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq list")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
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
	nc, js, s, err := connectDLQ(ctx, *natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	rep, err := collectDLQList(ctx, js, s, dlqScanCap)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, rep)
	}
	printDLQList(out, rep)
	return nil
}

func collectDLQList(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, scanCap int) (dlqListReport, error) {
	rep := dlqListReport{Stream: deadletter.Stream, Exists: s != nil, Consumers: []dlqConsumerSummary{}}
	counts, lastSeq, err := dlqSubjects(ctx, s)
	if err != nil {
		return rep, err
	}
	byName := map[string]*dlqConsumerSummary{}
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		c := dlqConsumerSummary{Consumer: name, Subject: contract.DLQSubject(name), DeadLetters: counts[name], Codes: map[string]uint64{}}
		// The first and the last of a subject are one request each, exact
		// whatever the scan reads.
		if m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.Subject)); err == nil {
			c.Oldest = m.Time
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return rep, fmt.Errorf("dlq: oldest of %s: %w", c.Subject, err)
		}
		if m, err := s.GetLastMsgForSubject(ctx, c.Subject); err == nil {
			c.Newest = m.Time
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return rep, fmt.Errorf("dlq: newest of %s: %w", c.Subject, err)
		}
		rep.Consumers = append(rep.Consumers, c)
	}
	for i := range rep.Consumers {
		byName[rep.Consumers[i].Consumer] = &rep.Consumers[i]
	}
	if len(rep.Consumers) == 0 {
		return rep, nil
	}
	rep.Capped, err = scanDLQ(ctx, js, contract.DLQSubjectPrefix+">", lastSeq, scanCap, true, func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
		rep.Scanned++
		c := byName[strings.TrimPrefix(m.Subject(), contract.DLQSubjectPrefix)]
		if c == nil {
			return nil // arrived after the subject listing
		}
		code := m.Headers().Get(deadletter.HeaderCode)
		if code == "" {
			code = "(none)"
		}
		c.Codes[code]++
		return nil
	})
	return rep, err
}

func printDLQList(out io.Writer, rep dlqListReport) {
	if !rep.Exists {
		fmt.Fprintf(out, "no dead letters: stream %s does not exist (consumers create it when they start)\n", rep.Stream)
		return
	}
	if len(rep.Consumers) == 0 {
		fmt.Fprintf(out, "no dead letters in %s\n", rep.Stream)
		return
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tDEAD LETTERS\tOLDEST\tNEWEST\tCODES")
	for _, c := range rep.Consumers {
		codes := make([]string, 0, len(c.Codes))
		for _, code := range slices.Sorted(maps.Keys(c.Codes)) {
			codes = append(codes, fmt.Sprintf("%s=%d", code, c.Codes[code]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", c.Consumer, c.DeadLetters, timeOrDash(c.Oldest), timeOrDash(c.Newest), strings.Join(codes, " "))
	}
	_ = tw.Flush()
	if rep.Capped {
		fmt.Fprintf(out, "codes counted over the first %d dead letters only (the scan stops there)\n", rep.Scanned)
	}
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// dlqPayload describes a dead letter's data.
type dlqPayload struct {
	Bytes int `json:"bytes"`
	// Event says the data decodes with contract.DecodeEvent.
	Event bool `json:"event"`
	// Kind, Key and Version are the event's, or, for data that is not a
	// valid event (an ingest document, a corrupt event), those a lenient
	// JSON decode finds.
	Kind    string `json:"kind,omitempty"`
	Key     string `json:"key,omitempty"`
	Version int64  `json:"version,omitempty"`
	// Head is the start of data that is not a valid event, quoted.
	Head string `json:"head,omitempty"`
}

const dlqHeadBytes = 64

func describePayload(data []byte) dlqPayload {
	p := dlqPayload{Bytes: len(data)}
	if ev, err := contract.DecodeEvent(data); err == nil {
		p.Event, p.Kind, p.Key, p.Version = true, string(ev.Kind), ev.Key, ev.Version
		return p
	}
	var loose struct {
		Kind    string `json:"kind"`
		Key     string `json:"key"`
		Version int64  `json:"version"`
	}
	if json.Unmarshal(data, &loose) == nil {
		p.Kind, p.Key, p.Version = loose.Kind, loose.Key, loose.Version
	}
	head := data
	if len(head) > dlqHeadBytes {
		head = head[:dlqHeadBytes]
	}
	p.Head = strconv.Quote(string(head))
	if len(data) > dlqHeadBytes {
		p.Head += "..."
	}
	return p
}

func (p dlqPayload) String() string {
	var b strings.Builder
	if p.Event {
		fmt.Fprintf(&b, "event %s key %q version %d", p.Kind, p.Key, p.Version)
		return b.String()
	}
	if p.Key != "" {
		fmt.Fprintf(&b, "not a valid event: ")
		if p.Kind != "" {
			fmt.Fprintf(&b, "kind %s ", p.Kind)
		}
		fmt.Fprintf(&b, "key %q version %d, ", p.Key, p.Version)
	}
	fmt.Fprintf(&b, "%d bytes: %s", p.Bytes, p.Head)
	return b.String()
}

// dlqEntry is one dead letter as `converge dlq show` describes it.
type dlqEntry struct {
	Seq            uint64     `json:"seq"`
	Time           time.Time  `json:"time"`
	Code           string     `json:"code"`
	Reason         string     `json:"reason"`
	OriginalSubj   string     `json:"original_subject"`
	OriginalStream string     `json:"original_stream,omitempty"`
	OriginalSeq    uint64     `json:"original_seq,omitempty"`
	Payload        dlqPayload `json:"payload"`
}

func newDLQEntry(seq uint64, t time.Time, h nats.Header, data []byte) dlqEntry {
	e := dlqEntry{
		Seq:            seq,
		Time:           t.UTC(),
		Code:           h.Get(deadletter.HeaderCode),
		Reason:         h.Get(deadletter.HeaderReason),
		OriginalSubj:   h.Get(deadletter.HeaderSubject),
		OriginalStream: h.Get(deadletter.HeaderStream),
		Payload:        describePayload(data),
	}
	e.OriginalSeq, _ = strconv.ParseUint(h.Get(deadletter.HeaderSeq), 10, 64)
	return e
}

// dlqShowReport is the answer of `converge dlq show`.
type dlqShowReport struct {
	Consumer    string     `json:"consumer"`
	Subject     string     `json:"subject"`
	Total       uint64     `json:"total"`
	Truncated   bool       `json:"truncated"`
	DeadLetters []dlqEntry `json:"dead_letters"`
}

func dlqShow(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq show")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
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
	consumer := pos[0]
	nc, js, _, counts, lastSeq, err := openConsumerDLQ(ctx, *natsURL, consumer)
	if err != nil {
		return err
	}
	defer nc.Close()
	rep := dlqShowReport{Consumer: consumer, Subject: contract.DLQSubject(consumer), Total: counts[consumer], DeadLetters: []dlqEntry{}}
	rep.Truncated, err = scanDLQ(ctx, js, rep.Subject, lastSeq, *limit, false, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		rep.DeadLetters = append(rep.DeadLetters, newDLQEntry(meta.Sequence.Stream, meta.Timestamp, m.Headers(), m.Data()))
		return nil
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, rep)
	}
	fmt.Fprintf(out, "dead letters of %s (%s): %d", rep.Consumer, rep.Subject, rep.Total)
	if rep.Truncated {
		fmt.Fprintf(out, ", the oldest %d shown (--limit)", len(rep.DeadLetters))
	}
	fmt.Fprintln(out)
	for _, e := range rep.DeadLetters {
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

// writeJSON writes v as the indented JSON of a command's --json output.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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

// redriveMsgID is the Nats-Msg-Id of a redriven dead letter: derived from
// its sequence in CONVERGE_DLQ, so that a retried redrive is dropped by the
// original stream's duplicate window, and from its data, so that the
// sequences of a recreated CONVERGE_DLQ, which restart, do not collide.
func redriveMsgID(seq uint64, data []byte) string {
	sum := sha256.Sum256(data)
	return "redrive-" + strconv.FormatUint(seq, 10) + "-" + hex.EncodeToString(sum[:8])
}

// redriveMsg is the message that puts dead letter dl back on its original
// subject: its data and headers, without the dead-letter headers and
// without directives to the server, which the publish options set.
func redriveMsg(dl *jetstream.RawStreamMsg) *nats.Msg {
	m := nats.NewMsg(dl.Header.Get(deadletter.HeaderSubject))
	m.Data = dl.Data
	for k, vs := range dl.Header {
		if strings.HasPrefix(k, "Converge-Dlq-") || strings.HasPrefix(k, "Nats-") {
			continue
		}
		for _, v := range vs {
			m.Header.Add(k, v)
		}
	}
	return m
}

func dlqRedrive(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dlq redrive")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	var seqs seqList
	f.Var(&seqs, "seq", "redrive the dead letter with this CONVERGE_DLQ sequence (repeatable, or comma-separated)")
	all := f.Bool("all", "", false, "redrive every dead letter of the consumer")
	dryRun := f.Bool("dry-run", "", false, "say what would be redriven, change nothing")
	pos, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("dlq redrive needs one consumer: converge dlq redrive CONSUMER (--seq N ... | --all) [--dry-run]")
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
	consumer := pos[0]
	nc, js, s, _, lastSeq, err := openConsumerDLQ(ctx, *natsURL, consumer)
	if err != nil {
		return err
	}
	defer nc.Close()
	subject := contract.DLQSubject(consumer)

	// Select first, then change: a bad --seq stops the command before
	// anything is republished.
	var selected []uint64
	if *all {
		if _, err := scanDLQ(ctx, js, subject, lastSeq, 0, true, func(_ jetstream.Msg, meta *jetstream.MsgMetadata) error {
			selected = append(selected, meta.Sequence.Stream)
			return nil
		}); err != nil {
			return err
		}
	} else {
		slices.Sort(seqs)
		selected = slices.Compact(seqs)
		for _, seq := range selected {
			if _, err := getDeadLetter(ctx, s, seq, subject); err != nil {
				return err
			}
		}
	}

	var redriven int
	for _, seq := range selected {
		dl, err := getDeadLetter(ctx, s, seq, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) && *all {
			continue // deleted since the selection: redriven by another run
		}
		if err != nil {
			return redriveStopped(out, redriven, err)
		}
		m := redriveMsg(dl)
		if m.Subject == "" {
			return redriveStopped(out, redriven, fmt.Errorf("dlq: dead letter #%d has no %s header: its original subject is unknown", seq, deadletter.HeaderSubject))
		}
		origStream := dl.Header.Get(deadletter.HeaderStream)
		if *dryRun {
			fmt.Fprintf(out, "would redrive #%d to %s (%s): %s\n", seq, m.Subject, orDash(origStream), describePayload(dl.Data))
			redriven++
			continue
		}
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(redriveMsgID(seq, dl.Data))}
		if origStream != "" {
			// Only into the stream it came from, should the subject have
			// been bound to another meanwhile.
			opts = append(opts, jetstream.WithExpectStream(origStream))
		}
		ack, err := js.PublishMsg(ctx, m, opts...)
		if err != nil {
			return redriveStopped(out, redriven, fmt.Errorf("dlq: republish #%d to %s (%s): %w", seq, m.Subject, orDash(origStream), err))
		}
		// Only now, with the republish stored, may the dead letter go.
		if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return redriveStopped(out, redriven, fmt.Errorf("dlq: #%d was republished to %s (%s seq %d) but not deleted from %s: %w; a rerun within the duplicate window stores it once", seq, m.Subject, ack.Stream, ack.Sequence, deadletter.Stream, err))
		}
		note := ""
		if ack.Duplicate {
			note = ", already there from an earlier redrive"
		}
		fmt.Fprintf(out, "redriven #%d to %s (%s seq %d)%s\n", seq, m.Subject, ack.Stream, ack.Sequence, note)
		redriven++
	}
	if *dryRun {
		fmt.Fprintf(out, "dry run: %d dead letters of %s would be redriven; nothing changed\n", redriven, consumer)
		return nil
	}
	fmt.Fprintf(out, "%d dead letters of %s redriven and deleted from %s\n", redriven, consumer, deadletter.Stream)
	return nil
}

// getDeadLetter reads dead letter seq and checks it is on subject.
func getDeadLetter(ctx context.Context, s jetstream.Stream, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	dl, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("dlq: no dead letter #%d in %s (redriven or deleted already?): %w", seq, deadletter.Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: read #%d: %w", seq, err)
	}
	if dl.Subject != subject {
		return nil, fmt.Errorf("dlq: dead letter #%d is on %s, not %s", seq, dl.Subject, subject)
	}
	return dl, nil
}

func redriveStopped(out io.Writer, done int, err error) error {
	if done > 0 {
		fmt.Fprintf(out, "stopped after %d redriven\n", done)
	}
	return err
}
