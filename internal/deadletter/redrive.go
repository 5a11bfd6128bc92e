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
	// DryRun reads and checks the dead letters, and changes nothing.
	DryRun bool
}

// Redriven is one dead letter put back on its original subject.
type Redriven struct {
	Seq     uint64 // in [Stream], where it is deleted
	Subject string // the original subject
	// Stream is the stream that stored the republished message, and
	// StreamSeq its sequence there; in a dry run Stream is the original
	// stream the dead letter names ("" if none) and StreamSeq is 0.
	Stream    string
	StreamSeq uint64
	// Duplicate says the stream held the message already, from an earlier
	// redrive that did not get to delete the dead letter.
	Duplicate bool
	Payload   Payload
}

// Redrive republishes the dead letters r selects to their original subject
// and stream, calling each (if not nil) after each one, and returns how
// many it redrove, also when it stops on an error.
//
// The order of its writes: every selected dead letter is read and checked
// first, so that a bad selection changes nothing; then, one at a time, the
// republish, and only once JetStream has acknowledged it, the delete from
// [Stream]. A crash between the two leaves the dead letter and its
// republished message: the republish carries the Nats-Msg-Id
// redrive-<seq>-<data hash>, so a rerun within the original stream's
// duplicate window stores it once (reported as Duplicate), and beyond the
// window consumers are idempotent.
//
// A dead letter without its original subject, or whose original stream no
// longer holds that subject, is refused and stays.
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

	var selected []uint64
	if r.All {
		if _, err := q.Scan(ctx, ScanOptions{Filter: subject, LastSeq: lastSeq, HeadersOnly: true}, func(_ jetstream.Msg, meta *jetstream.MsgMetadata) error {
			selected = append(selected, meta.Sequence.Stream)
			return nil
		}); err != nil {
			return 0, err
		}
	} else {
		selected = slices.Compact(slices.Sorted(slices.Values(r.Seqs)))
		for _, seq := range selected {
			if _, err := q.get(ctx, seq, subject); err != nil {
				return 0, err
			}
		}
	}

	var n int
	for _, seq := range selected {
		dl, err := q.get(ctx, seq, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) && r.All {
			continue // deleted since the selection: redriven by another run
		}
		if err != nil {
			return n, err
		}
		done, err := q.redriveOne(ctx, seq, dl, r.DryRun)
		if err != nil {
			return n, err
		}
		n++
		if each != nil {
			each(done)
		}
	}
	return n, nil
}

func (q *Queue) redriveOne(ctx context.Context, seq uint64, dl *jetstream.RawStreamMsg, dryRun bool) (Redriven, error) {
	m := redriveMsg(dl)
	if m.Subject == "" {
		return Redriven{}, fmt.Errorf("dead letter #%d has no %s header: its original subject is unknown", seq, HeaderSubject)
	}
	origStream := dl.Header.Get(HeaderStream)
	done := Redriven{Seq: seq, Subject: m.Subject, Stream: origStream, Payload: DescribePayload(dl.Data)}
	if dryRun {
		return done, nil
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(redriveMsgID(seq, dl.Data))}
	if origStream != "" {
		// Only into the stream it came from, should the subject have been
		// bound to another meanwhile.
		opts = append(opts, jetstream.WithExpectStream(origStream))
	}
	ack, err := q.js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return Redriven{}, fmt.Errorf("republish #%d to %s (%s): %w", seq, m.Subject, orDash(origStream), err)
	}
	// Only now, with the republish stored, may the dead letter go.
	if err := q.s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return Redriven{}, fmt.Errorf("#%d was republished to %s (%s seq %d) but not deleted from %s: %w; a rerun within the duplicate window stores it once",
			seq, m.Subject, ack.Stream, ack.Sequence, Stream, err)
	}
	done.Stream, done.StreamSeq, done.Duplicate = ack.Stream, ack.Sequence, ack.Duplicate
	return done, nil
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
