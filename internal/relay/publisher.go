package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/pkg/contract"
)

// publisher publishes to JetStream asynchronously: core NATS publishes whose
// replies, the stream's acknowledgements, arrive on one inbox subscription
// per session. Each publish in flight owns one slot of a ring as large as
// the relay's window; slot i always uses the reply subject <inbox>.i, so a
// publish allocates nothing for its reply, and the message is written to
// the connection's buffer before Publish returns, so the payload is not
// copied. (jetstream.PublishMsgAsync keeps a future with two channels, a
// map entry and a copy of every message: about a quarter of the relay's
// CPU per event.)
//
// The caller keeps at most len(slots) publishes in flight and consumes
// acknowledgements in publish order; a slot is reused only after the
// acknowledgement of its previous publish was consumed.
type publisher struct {
	nc *nats.Conn
	// stream acknowledges the publishes to converge.docs.>; effects, when
	// not empty, names the effects' stream, which acknowledges those to
	// converge.events.> (or its partitions, those to converge.effects.>).
	stream  string
	effects string
	sub     *nats.Subscription
	prefix  string // the inbox, with a trailing dot
	replies []string
	slots   []ackSlot
	next    uint64        // sequence of the next publish; its slot is next % len(slots)
	wake    chan struct{} // signalled (never blocking) on every acknowledgement
	// status hears every change of the connection's state after the
	// session began, synchronously (the connection sends it under its lock
	// before the change takes effect). Once the connection was lost, the
	// session publishes nothing more: what the old connection had not
	// delivered is lost, and a later message reaching the new server
	// first would be stored out of commit order, before an older version
	// of its document that the next session publishes again.
	status chan nats.Status
	lost   bool
	// last is when the newest acknowledgement arrived, in nanoseconds
	// after origin, the publisher's creation: a monotonic reading, since
	// storedUpTo compares it with other acknowledgements' times, which a
	// step of the wall clock must not move.
	origin time.Time
	last   atomic.Int64

	msg nats.Msg // reused: PublishMsg encodes it before returning
	id  []string // the Nats-Msg-Id header's value

	// The documents' stream stores the session's publishes in publish
	// order or not at all. A publish lost in flight while the connection
	// stays up (a stream leader's loss on a cluster) must not let the
	// publishes after it be stored before it is published again: a newer
	// version of a document stored before an older one, which then pushes
	// it out of the subject's history. So once the session knows the
	// stream's last sequence, each publish carries
	// Nats-Expected-Last-Sequence, the sequence its predecessor gets, and
	// the stream refuses it when its last message is another; every
	// publish after a lost one is refused. The session starts careful: one
	// event at a time, without the header (events published again from the
	// confirmed position are duplicates, which take no sequence), until
	// one is stored; its sequence is the base (see chain). The header is
	// checked by the stream's leader before it proposes the message, so no
	// replica can disagree on it. (Nats-Expected-Last-Msg-Id is checked by
	// every replica as it applies, and a replica that caught up after a
	// restart does not know the id of its last message: it rejects the
	// entry and stops.) Not on the effects' stream, whose order nothing
	// reads.
	chained bool
	lastSeq uint64   // the sequence the previous chained publish gets
	expect  []string // the header's value
	// broken is set when the stream refused a publish because its last
	// sequence was not the one expected: a publish before it is lost.
	broken        atomic.Bool
	refusedMetric prometheus.Counter // counts those refusals; may be nil
}

// ackSlot is the outcome of one publish: set by the subscription's
// goroutine, read by the session after state is no longer ackWaiting.
type ackSlot struct {
	state   atomic.Uint32
	effects string    // the effects' stream (or partition) published to, "" for the documents'; written before the publish
	seq     uint64    // the stream sequence acknowledged, written before state
	err     error     // written before state is set to ackFailed
	at      time.Time // when the acknowledgement arrived (with its monotonic reading), written before state
}

const (
	ackWaiting uint32 = iota
	ackStored
	ackDuplicate
	ackFailed
)

// traceParentHeader carries an event's W3C trace context.
const traceParentHeader = "traceparent"

func newPublisher(nc *nats.Conn, stream, effects string, window int) (*publisher, error) {
	p := &publisher{
		nc: nc, stream: stream, effects: effects, origin: time.Now(),
		prefix:  nc.NewInbox() + ".", // under the connection's inbox prefix, where its user may subscribe
		replies: make([]string, window),
		slots:   make([]ackSlot, window),
		wake:    make(chan struct{}, 1),
		id:      make([]string, 1),
		expect:  make([]string, 1),
	}
	for i := range p.replies {
		p.replies[i] = p.prefix + strconv.Itoa(i)
	}
	p.msg.Header = nats.Header{jetstream.MsgIDHeader: p.id}
	p.status = nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	if st := nc.Status(); st != nats.CONNECTED {
		nc.RemoveStatusListener(p.status)
		return nil, fmt.Errorf("relay: the NATS connection is %v", st)
	}
	sub, err := nc.Subscribe(p.prefix+"*", p.onAck)
	if err != nil {
		nc.RemoveStatusListener(p.status)
		return nil, fmt.Errorf("relay: subscribe to acknowledgements: %w", err)
	}
	// The window bounds what can be pending on it; never drop an ack as a
	// slow consumer.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		nc.RemoveStatusListener(p.status)
		return nil, fmt.Errorf("relay: acknowledgement subscription: %w", err)
	}
	p.sub = sub
	return p, nil
}

// close stops listening: acknowledgements of this session that are still
// on their way are dropped, and the next session republishes.
func (p *publisher) close() {
	_ = p.sub.Unsubscribe()
	p.nc.RemoveStatusListener(p.status)
}

// connectionLost reports whether the connection's state changed since the
// session began (a disconnect, a reconnect, a close): a channel receive,
// not a lock of the connection.
func (p *publisher) connectionLost() bool {
	if p.lost {
		return true
	}
	select {
	case <-p.status:
		p.lost = true
	default:
	}
	return p.lost
}

// publish sends one message and returns its sequence. msgID is its
// Nats-Msg-Id; commitTimeHdr is the value of the commit-time header, shared
// by a transaction's messages; reemission, when not nil, the value of the
// re-emission header; traceParent, when not nil, the traceparent header's;
// effects, when not empty, is the effects' stream (or partition) whose
// subject it is.
func (p *publisher) publish(subject, msgID string, commitTimeHdr, reemission, traceParent []string, data []byte, effects string) (uint64, error) {
	if p.connectionLost() {
		return 0, errReconnected
	}
	seq := p.next
	i := seq % uint64(len(p.slots))
	p.slots[i].err = nil
	p.slots[i].effects = effects
	p.slots[i].state.Store(ackWaiting)
	p.id[0] = msgID
	if effects == "" && p.chained {
		p.expect[0] = strconv.FormatUint(p.lastSeq, 10)
		p.msg.Header[jetstream.ExpectedLastSeqHeader] = p.expect
	} else {
		delete(p.msg.Header, jetstream.ExpectedLastSeqHeader)
	}
	p.msg.Header[contract.HeaderCommitTime] = commitTimeHdr
	if reemission != nil {
		p.msg.Header[contract.HeaderReemission] = reemission
	} else {
		delete(p.msg.Header, contract.HeaderReemission)
	}
	if traceParent != nil {
		p.msg.Header[traceParentHeader] = traceParent
	} else {
		delete(p.msg.Header, traceParentHeader)
	}
	p.msg.Subject, p.msg.Reply, p.msg.Data = subject, p.replies[i], data
	err := p.nc.PublishMsg(&p.msg)
	p.msg.Data = nil // the payload belongs to the caller's buffer
	if err != nil {
		return 0, err
	}
	p.next++
	if effects == "" && p.chained {
		p.lastSeq++
	}
	// Lost while this one was written: it may be in the reconnect buffer,
	// bound for the new server after messages the old one never got. The
	// relay's own connection has no such buffer (such a publish fails);
	// one shared with other services has, and this ends the session before
	// anything newer follows it.
	if p.connectionLost() {
		return seq, errReconnected
	}
	return seq, nil
}

// outcome is the state of publish seq, and its error when it failed.
func (p *publisher) outcome(seq uint64) (uint32, error) {
	s := &p.slots[seq%uint64(len(p.slots))]
	st := s.state.Load()
	if st == ackFailed {
		return st, s.err
	}
	return st, nil
}

// ackedAt is when the acknowledgement of publish seq arrived; valid once
// outcome reported it no longer waiting.
func (p *publisher) ackedAt(seq uint64) time.Time { return p.slots[seq%uint64(len(p.slots))].at }

// chain starts the expectations after publish seq, the session's only
// one to the documents' stream in flight, was stored: the next publish
// expects its sequence as the stream's last.
func (p *publisher) chain(seq uint64) {
	p.chained, p.lastSeq = true, p.slots[seq%uint64(len(p.slots))].seq
}

// lastAck is when the newest acknowledgement of the session arrived.
func (p *publisher) lastAck() time.Time { return p.origin.Add(time.Duration(p.last.Load())) }

// reconnected reports whether the connection was re-established since the
// session began.
func (p *publisher) reconnected() bool { return p.connectionLost() }

// onAck records an acknowledgement: runs on the subscription's goroutine.
func (p *publisher) onAck(m *nats.Msg) {
	i, err := strconv.Atoi(strings.TrimPrefix(m.Subject, p.prefix))
	if err != nil || i < 0 || i >= len(p.slots) {
		return // not a reply of ours
	}
	s := &p.slots[i]
	s.at = time.Now()
	p.last.Store(int64(s.at.Sub(p.origin)))
	stream := p.stream
	if s.effects != "" {
		stream = s.effects
	}
	state, seq, ackErr := parseAck(m, stream)
	s.seq = seq
	if ackErr != nil {
		s.err = ackErr
		var wl *wrongLastError
		if errors.As(ackErr, &wl) {
			p.broken.Store(true)
			if p.refusedMetric != nil {
				p.refusedMetric.Inc()
			}
		}
	}
	s.state.Store(state)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

var (
	ackPrefix     = []byte(`{"stream":"`)
	ackError      = []byte(`"error"`)
	ackDuplicated = []byte(`"duplicate"`)
)

// parseAck reads a JetStream publish acknowledgement from stream: a JSON
// PubAck and the sequence it gives, an API error, or a no-responders
// status when no stream listens on the subject.
func parseAck(m *nats.Msg, stream string) (uint32, uint64, error) {
	d := m.Data
	// The common case, a plain PubAck in the server's own encoding, is
	// checked without decoding it; anything else (a duplicate, an error) is
	// decoded.
	if bytes.HasPrefix(d, ackPrefix) && bytes.HasPrefix(d[len(ackPrefix):], []byte(stream)) &&
		len(d) > len(ackPrefix)+len(stream) && d[len(ackPrefix)+len(stream)] == '"' &&
		!bytes.Contains(d, ackError) && !bytes.Contains(d, ackDuplicated) {
		return ackStored, ackSeq(d[len(ackPrefix)+len(stream):]), nil
	}
	if len(d) == 0 && m.Header.Get("Status") == "503" {
		return ackFailed, 0, fmt.Errorf("no stream listens on %s (no responders): %w", m.Subject, nats.ErrNoResponders)
	}
	var ack struct {
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
		Error     *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(d, &ack); err != nil {
		return ackFailed, 0, fmt.Errorf("unreadable acknowledgement %q: %w", truncate(d, 200), err)
	}
	switch {
	case ack.Stream != "" && ack.Stream != stream:
		return ackFailed, 0, fmt.Errorf("acknowledged by stream %q, not %q: another stream listens on the subject", ack.Stream, stream)
	case ack.Error != nil && ack.Error.ErrCode == errCodeWrongLastSeq:
		last, _ := strings.CutPrefix(ack.Error.Description, "wrong last sequence: ")
		return ackFailed, 0, &wrongLastError{last: last}
	case ack.Error != nil:
		return ackFailed, 0, fmt.Errorf("stream refused the message: %s (code %d, error code %d)", ack.Error.Description, ack.Error.Code, ack.Error.ErrCode)
	case ack.Duplicate:
		return ackDuplicate, ack.Seq, nil
	}
	return ackStored, ack.Seq, nil
}

// ackSeq reads the value of "seq" in the rest of a PubAck (0 when there
// is none).
func ackSeq(d []byte) uint64 {
	i := bytes.Index(d, ackSeqKey)
	if i < 0 {
		return 0
	}
	var seq uint64
	for _, c := range d[i+len(ackSeqKey):] {
		if c < '0' || c > '9' {
			break
		}
		seq = seq*10 + uint64(c-'0')
	}
	return seq
}

var ackSeqKey = []byte(`"seq":`)

// errCodeWrongLastSeq is JetStream's error code for a publish whose
// Nats-Expected-Last-Sequence is not the stream's last sequence.
const errCodeWrongLastSeq = 10071

// wrongLastError is a publish the stream refused because its last
// sequence (last, when it said) was not the one the publish expected.
type wrongLastError struct{ last string }

func (e *wrongLastError) Error() string {
	last := e.last
	if last == "" {
		last = "another"
	}
	return fmt.Sprintf("stream refused the message: its last sequence (%s) is not the one the message follows", last)
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// errAckTimeout is a publish whose acknowledgement did not arrive in time:
// the message or its reply was lost (a NATS restart, a partition).
var errAckTimeout = errors.New("no acknowledgement in time")

// errReconnected is a publish awaiting its acknowledgement, or about to
// be sent, when the NATS connection was lost: the message or its
// acknowledgement may have been lost with the old connection.
var errReconnected = errors.New("the NATS connection was lost while publishes awaited acknowledgement")

// errLostBefore ends a session whose oldest publish awaiting its
// acknowledgement precedes one the stream refused for not following the
// stream's last sequence: that publish never reached the stream (a stream
// leader lost it), and nothing after it will be stored.
var errLostBefore = errors.New("the stream refused a later publish for not following its last message: an earlier publish was lost")
