package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// DefaultScanCap bounds the dead letters [Queue.Summarize] reads to count
// codes, when its caller sets no cap.
const DefaultScanCap = 100_000

// ConsumerSummary is one consumer's dead letters in a [Summary].
type ConsumerSummary struct {
	Consumer    string            `json:"consumer"`
	Subject     string            `json:"subject"`
	DeadLetters uint64            `json:"dead_letters"`
	Oldest      time.Time         `json:"oldest,omitzero"`
	Newest      time.Time         `json:"newest,omitzero"`
	Codes       map[string]uint64 `json:"codes"`
}

// Summary is the dead letters of every consumer that has any.
type Summary struct {
	Stream    string            `json:"stream"`
	Exists    bool              `json:"exists"`
	Consumers []ConsumerSummary `json:"consumers"`
	// Scanned is the number of dead letters read to count codes; Capped
	// says the scan stopped at its cap, so codes cover only those.
	Scanned uint64 `json:"scanned"`
	Capped  bool   `json:"capped"`
}

// NoCode counts, in [ConsumerSummary.Codes], the dead letters without a
// code.
const NoCode = "(none)"

// Summarize counts the dead letters of each consumer, sorted by consumer:
// their number and their oldest and newest are exact, their codes are
// counted over the first scanCap dead letters (0: [DefaultScanCap]).
func (q *Queue) Summarize(ctx context.Context, scanCap int) (Summary, error) {
	if scanCap <= 0 {
		scanCap = DefaultScanCap
	}
	sum := Summary{Stream: Stream, Exists: q.s != nil, Consumers: []ConsumerSummary{}}
	counts, lastSeq, err := q.Counts(ctx)
	if err != nil {
		return sum, err
	}
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		c := ConsumerSummary{Consumer: name, Subject: contract.DLQSubject(name), DeadLetters: counts[name], Codes: map[string]uint64{}}
		// The first and the last of a subject are one request each, exact
		// whatever the scan reads.
		if m, err := q.s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.Subject)); err == nil {
			c.Oldest = m.Time
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return sum, fmt.Errorf("oldest of %s: %w", c.Subject, err)
		}
		if m, err := q.s.GetLastMsgForSubject(ctx, c.Subject); err == nil {
			c.Newest = m.Time
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return sum, fmt.Errorf("newest of %s: %w", c.Subject, err)
		}
		sum.Consumers = append(sum.Consumers, c)
	}
	if len(sum.Consumers) == 0 {
		return sum, nil
	}
	byName := map[string]*ConsumerSummary{}
	for i := range sum.Consumers {
		byName[sum.Consumers[i].Consumer] = &sum.Consumers[i]
	}
	sum.Capped, err = q.Scan(ctx, ScanOptions{LastSeq: lastSeq, Limit: scanCap, HeadersOnly: true}, func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
		sum.Scanned++
		c := byName[strings.TrimPrefix(m.Subject(), contract.DLQSubjectPrefix)]
		if c == nil {
			return nil // arrived after the subject listing
		}
		code := m.Headers().Get(HeaderCode)
		if code == "" {
			code = NoCode
		}
		c.Codes[code]++
		return nil
	})
	return sum, err
}

// Page is the dead letters of one consumer, oldest first.
type Page struct {
	Consumer string `json:"consumer"`
	Subject  string `json:"subject"`
	// Total is the number of dead letters of the consumer; Truncated says
	// the limit left some out of DeadLetters.
	Total       uint64  `json:"total"`
	Truncated   bool    `json:"truncated"`
	DeadLetters []Entry `json:"dead_letters"`
}

// Read returns the oldest limit dead letters of consumer (0: all of them).
// A consumer without dead letters is an [*UnknownConsumerError].
func (q *Queue) Read(ctx context.Context, consumer string, limit int) (Page, error) {
	p := Page{Consumer: consumer, Subject: contract.DLQSubject(consumer), DeadLetters: []Entry{}}
	if limit < 0 {
		return p, fmt.Errorf("limit %d: want 0 (all) or more", limit)
	}
	total, lastSeq, err := q.consumer(ctx, consumer)
	if err != nil {
		return p, err
	}
	p.Total = total
	p.Truncated, err = q.Scan(ctx, ScanOptions{Filter: p.Subject, LastSeq: lastSeq, Limit: limit}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		p.DeadLetters = append(p.DeadLetters, NewEntry(meta.Sequence.Stream, meta.Timestamp, m.Headers(), m.Data()))
		return nil
	})
	return p, err
}

// Entry is one dead letter, described.
type Entry struct {
	Seq            uint64    `json:"seq"`
	Time           time.Time `json:"time"`
	Code           string    `json:"code"`
	Reason         string    `json:"reason"`
	OriginalSubj   string    `json:"original_subject"`
	OriginalStream string    `json:"original_stream,omitempty"`
	OriginalSeq    uint64    `json:"original_seq,omitempty"`
	Payload        Payload   `json:"payload"`
}

// NewEntry describes the dead letter stored at seq at time t.
func NewEntry(seq uint64, t time.Time, h nats.Header, data []byte) Entry {
	e := Entry{
		Seq:            seq,
		Time:           t.UTC(),
		Code:           h.Get(HeaderCode),
		Reason:         h.Get(HeaderReason),
		OriginalSubj:   h.Get(HeaderSubject),
		OriginalStream: h.Get(HeaderStream),
		Payload:        DescribePayload(data),
	}
	e.OriginalSeq, _ = strconv.ParseUint(h.Get(HeaderSeq), 10, 64)
	return e
}

// Payload describes a dead letter's data.
type Payload struct {
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

// headBytes is how much of data that is not an event Payload.Head shows.
const headBytes = 64

// DescribePayload describes data.
func DescribePayload(data []byte) Payload {
	p := Payload{Bytes: len(data)}
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
	if len(head) > headBytes {
		head = head[:headBytes]
	}
	p.Head = strconv.Quote(string(head))
	if len(data) > headBytes {
		p.Head += "..."
	}
	return p
}

// String is p in one line.
func (p Payload) String() string {
	var b strings.Builder
	if p.Event {
		fmt.Fprintf(&b, "event %s key %q version %d", p.Kind, p.Key, p.Version)
		return b.String()
	}
	if p.Key != "" {
		b.WriteString("not a valid event: ")
		if p.Kind != "" {
			fmt.Fprintf(&b, "kind %s ", p.Kind)
		}
		fmt.Fprintf(&b, "key %q version %d, ", p.Key, p.Version)
	}
	fmt.Fprintf(&b, "%d bytes: %s", p.Bytes, p.Head)
	return b.String()
}
