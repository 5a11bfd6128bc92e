package deadletter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// Redrive says which dead letters of a consumer [Queue.Redrive] puts back:
// those at Seqs, or All of them.
type Redrive struct {
	Consumer string
	Seqs     []uint64 // sequences in [Stream]
	All      bool
	// Writer re-emits the documents of the dead letters of CONVERGE_DOCS's
	// consumers (the [Reemit] path); without one they are refused, unless
	// DryRun.
	Writer Reemitter
	// DryRun reads and checks the dead letters, and changes nothing.
	DryRun bool
}

// Redriven is one dead letter put back, or kept.
type Redriven struct {
	Seq     uint64 // in [Stream], where it is deleted
	Subject string // the original subject
	Code    string // the dead letter's code
	Path    Path
	// Stream is the stream that stored the republished message, and
	// StreamSeq its sequence there; in a dry run, and on the [Reemit] path,
	// Stream is the original stream the dead letter names ("" if none) and
	// StreamSeq is 0.
	Stream    string
	StreamSeq uint64
	// Duplicate says the stream held the message already, from an earlier
	// redrive that did not get to delete the dead letter.
	Duplicate bool
	// Key is the document a [Reemit] re-emits; Version, EventID and
	// Emission are those the writer re-emitted: the document's current
	// version, which may be newer than the dead letter's (Payload.Version).
	Key      string
	Version  int64
	EventID  uuid.UUID
	Emission int64
	// Kept says why the dead letter stays in [Stream] ("" when it was
	// redriven and deleted, or would be in a dry run).
	Kept    string
	Payload Payload
}

// Redrive puts back the dead letters r selects, calling each (if not nil)
// with each one redriven or kept, and returns how many it redrove (and
// deleted), also when it stops on an error.
//
// The path of a dead letter is its original subject's stream ([PathOf]):
//
//   - an ingest dead letter (converge.ingest.>) is republished to its
//     original subject and stream; once JetStream has acknowledged the
//     republish, it is deleted from [Stream]. A crash between the two
//     leaves the dead letter and its republished message: the republish
//     carries the Nats-Msg-Id redrive-<seq>-<data hash>, so a rerun within
//     the stream's duplicate window stores it once (reported as
//     Duplicate), and beyond the window the writer is idempotent.
//   - a document dead letter (converge.docs.>) is not published by the
//     redrive: the relay alone publishes to CONVERGE_DOCS. r.Writer
//     re-emits its document's current version through the outbox, in
//     requests of up to 500 keys (a key once for all its dead letters);
//     once the writer acknowledged a key's re-emission, the dead letters of
//     that key are deleted from [Stream]. A crash between the two leaves
//     the dead letter and the re-emission: a rerun re-emits it again, which
//     every consumer applies idempotently. A projection needs the latest
//     state, which the re-emission is. A dead letter whose data names no
//     valid key with its original subject, or whose key the writer does
//     not find or cannot reproduce, is kept and reported with the reason.
//     A notifier skips a re-emitted event unless it runs with
//     -notify-replayed.
//
// Every selected dead letter is read and checked first, so that a bad
// selection changes nothing. A dead letter without its original subject,
// or with one of no path, stops the redrive and stays; the document dead
// letters read before it are re-emitted first. Ingest dead letters are
// reported as they go, document ones once their request is answered.
func (q *Queue) Redrive(ctx context.Context, r Redrive, each func(Redriven)) (int, error) {
	switch {
	case len(r.Seqs) == 0 && !r.All:
		return 0, errors.New("no dead letters selected: give sequences or All")
	case len(r.Seqs) > 0 && r.All:
		return 0, errors.New("sequences and All exclude each other")
	}
	_, lastSeq, err := q.consumer(ctx, r.Consumer)
	if err != nil {
		return 0, err
	}
	subject := contract.DLQSubject(r.Consumer)

	var (
		selected  []uint64
		documents bool // some selected dead letter is a document's
	)
	if r.All {
		if _, err := q.Scan(ctx, ScanOptions{Filter: subject, LastSeq: lastSeq, HeadersOnly: true}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
			selected = append(selected, meta.Sequence.Stream)
			documents = documents || isDocument(m.Headers().Get(HeaderSubject))
			return nil
		}); err != nil {
			return 0, err
		}
	} else {
		selected = slices.Compact(slices.Sorted(slices.Values(r.Seqs)))
		for _, seq := range selected {
			dl, err := q.get(ctx, seq, subject)
			if err != nil {
				return 0, err
			}
			documents = documents || isDocument(dl.Header.Get(HeaderSubject))
		}
	}
	if documents && r.Writer == nil && !r.DryRun {
		return 0, ErrNoReemitter
	}

	report := func(d Redriven) {
		if each != nil {
			each(d)
		}
	}
	var (
		n     int
		batch []Redriven
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		k, err := q.reemit(ctx, r.Writer, batch, report)
		n += k
		batch = batch[:0]
		return err
	}
	// stop ends the redrive on err, once the document dead letters read
	// before it are re-emitted.
	stop := func(err error) (int, error) {
		if ferr := flush(); ferr != nil {
			return n, errors.Join(err, ferr)
		}
		return n, err
	}
	for _, seq := range selected {
		dl, err := q.get(ctx, seq, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) && r.All {
			continue // deleted since the selection: redriven by another run
		}
		if err != nil {
			return stop(err)
		}
		origSubj, origStream := dl.Header.Get(HeaderSubject), dl.Header.Get(HeaderStream)
		path, err := PathOf(origSubj, origStream)
		if err != nil {
			return stop(fmt.Errorf("dead letter #%d: %w", seq, err))
		}
		d := Redriven{Seq: seq, Subject: origSubj, Code: dl.Header.Get(HeaderCode), Path: path, Stream: origStream, Payload: DescribePayload(dl.Data)}
		if path == Republish {
			done, err := q.republish(ctx, dl, d, r.DryRun)
			if err != nil {
				return stop(err)
			}
			n++
			report(done)
			continue
		}
		key, err := documentKey(origSubj, d.Payload)
		if err != nil {
			d.Kept = err.Error()
			report(d)
			continue
		}
		d.Key = key
		if r.DryRun {
			n++
			report(d)
			continue
		}
		batch = append(batch, d)
		if len(batch) >= reemitBatch {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := flush(); err != nil {
		return n, err
	}
	return n, nil
}

// republish puts ingest dead letter dl (d describes it) back on its
// original subject, and deletes it once JetStream acknowledged that.
func (q *Queue) republish(ctx context.Context, dl *jetstream.RawStreamMsg, d Redriven, dryRun bool) (Redriven, error) {
	if dryRun {
		return d, nil
	}
	m := redriveMsg(dl)
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(redriveMsgID(d.Seq, dl.Data))}
	if d.Stream != "" {
		// Only into the stream it came from, should the subject have been
		// bound to another meanwhile.
		opts = append(opts, jetstream.WithExpectStream(d.Stream))
	}
	ack, err := q.js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return Redriven{}, fmt.Errorf("republish #%d to %s (%s): %w", d.Seq, m.Subject, orDash(d.Stream), err)
	}
	// Only now, with the republish stored, may the dead letter go.
	if err := q.s.DeleteMsg(ctx, d.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return Redriven{}, fmt.Errorf("#%d was republished to %s (%s seq %d) but not deleted from %s: %w; a rerun within the duplicate window stores it once",
			d.Seq, m.Subject, ack.Stream, ack.Sequence, Stream, err)
	}
	d.Stream, d.StreamSeq, d.Duplicate = ack.Stream, ack.Sequence, ack.Duplicate
	return d, nil
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
	m := nats.NewMsg(dl.Header.Get(HeaderSubject))
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

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// isDocument reports whether subject is a document event's: of the
// documents' stream, the effects' stream, or their partitions.
func isDocument(subject string) bool {
	return strings.HasPrefix(subject, contract.DocsSubjectPrefix) || strings.HasPrefix(subject, contract.PartsSubjectPrefix) ||
		strings.HasPrefix(subject, contract.EventsSubjectPrefix) || strings.HasPrefix(subject, contract.EffectsSubjectPrefix)
}
