package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// idle ends a scan that receives nothing for this long: the dead letters
// it expected were deleted meanwhile.
const idle = 5 * time.Second

// Queue reads and redrives the dead letters of [Stream]. A Queue over a
// stream that does not exist yet (no consumer has started) reads as empty.
type Queue struct {
	js jetstream.JetStream
	s  jetstream.Stream // nil: the stream does not exist
}

// Open returns the queue of dead letters on js.
func Open(ctx context.Context, js jetstream.JetStream) (*Queue, error) {
	s, err := js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return &Queue{js: js}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", Stream, err)
	}
	return &Queue{js: js, s: s}, nil
}

// Exists reports whether the dead-letter stream existed when q was opened.
func (q *Queue) Exists() bool { return q.s != nil }

// Counts returns the number of dead letters of each consumer that has any,
// and the stream's last sequence.
func (q *Queue) Counts(ctx context.Context) (map[string]uint64, uint64, error) {
	counts := map[string]uint64{}
	if q.s == nil {
		return counts, 0, nil
	}
	info, err := q.s.Info(ctx, jetstream.WithSubjectFilter(contract.DLQSubjectPrefix+">"))
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: %w", Stream, err)
	}
	for subj, n := range info.State.Subjects {
		if name, ok := strings.CutPrefix(subj, contract.DLQSubjectPrefix); ok && n > 0 {
			counts[name] = n
		}
	}
	return counts, info.State.LastSeq, nil
}

// Count returns the number of dead letters of consumer.
func (q *Queue) Count(ctx context.Context, consumer string) (uint64, error) {
	if q.s == nil {
		return 0, nil
	}
	subject := contract.DLQSubject(consumer)
	info, err := q.s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("dead letters of %s: %w", consumer, err)
	}
	return info.State.Subjects[subject], nil
}

// consumer checks that consumer has dead letters, and returns their
// number and the stream's last sequence.
func (q *Queue) consumer(ctx context.Context, consumer string) (uint64, uint64, error) {
	counts, lastSeq, err := q.Counts(ctx)
	if err != nil {
		return 0, 0, err
	}
	if counts[consumer] == 0 {
		return 0, 0, newUnknownConsumer(consumer, counts)
	}
	return counts[consumer], lastSeq, nil
}

// ScanOptions say what a scan reads.
type ScanOptions struct {
	// Filter is the subject to read, by default every consumer's.
	Filter string
	// LastSeq ends the scan: dead letters stored after it (such as a
	// redriven message dead-lettered again) are left for the next one. 0
	// reads nothing.
	LastSeq uint64
	// Limit stops the scan after this many dead letters (0: no limit).
	Limit int
	// HeadersOnly reads the headers without the data.
	HeadersOnly bool
}

// Scan calls fn with each dead letter of opts, in stream order, and reports
// whether opts.Limit left some unread. It reads through an ordered
// consumer, which changes nothing in the stream, and removes it at the end.
func (q *Queue) Scan(ctx context.Context, opts ScanOptions, fn func(jetstream.Msg, *jetstream.MsgMetadata) error) (truncated bool, err error) {
	if q.s == nil || opts.LastSeq == 0 {
		return false, nil
	}
	filter := opts.Filter
	if filter == "" {
		filter = contract.DLQSubjectPrefix + ">"
	}
	cons, err := q.js.OrderedConsumer(ctx, Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		HeadersOnly:    opts.HeadersOnly,
		// Removed below; this is for a scan that dies first.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return false, fmt.Errorf("read %s: %w", filter, err)
	}
	batch := 256
	if opts.Limit > 0 && opts.Limit < batch {
		batch = opts.Limit
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(batch))
	if err != nil {
		return false, fmt.Errorf("read %s: %w", filter, err)
	}
	defer func() {
		it.Stop()
		// An ordered consumer is removed only when inactive; an operator
		// looking at the stream's consumers should not see the scan's.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = q.js.DeleteConsumer(dctx, Stream, info.Name)
			cancel()
		}
	}()
	for n := 0; ; {
		nctx, cancel := context.WithTimeout(ctx, idle)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return false, nil
			}
			return false, fmt.Errorf("read %s: %w", filter, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", filter, err)
		}
		if meta.Sequence.Stream > opts.LastSeq {
			return false, nil
		}
		if err := fn(m, meta); err != nil {
			return false, err
		}
		n++
		if meta.NumPending == 0 || meta.Sequence.Stream >= opts.LastSeq {
			return false, nil
		}
		if opts.Limit > 0 && n >= opts.Limit {
			return true, nil
		}
	}
}

// get reads dead letter seq and checks that it is on subject.
func (q *Queue) get(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	dl, err := q.s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("no dead letter #%d in %s (redriven or deleted already?): %w", seq, Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read #%d: %w", seq, err)
	}
	if dl.Subject != subject {
		return nil, fmt.Errorf("dead letter #%d is on %s, not %s", seq, dl.Subject, subject)
	}
	return dl, nil
}
