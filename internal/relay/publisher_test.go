package relay

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// awaitOutcome polls the publisher until publish seq is answered.
func awaitOutcome(t *testing.T, p *publisher, seq uint64) (uint32, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, err := p.outcome(seq); st != ackWaiting {
			return st, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %d: no acknowledgement within 10s", seq)
		}
		select {
		case <-p.wake:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// withStream starts a NATS server with the stream sc and connects to it.
func withStream(t *testing.T, sc jetstream.StreamConfig) (*nats.Conn, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	nc := testenv.StartNATS(t).Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, s
}

func TestPublisherOutcomes(t *testing.T) {
	nc, js, _ := withStream(t, jetstream.StreamConfig{Name: "DOCS", Subjects: []string{"docs.>"}, Duplicates: time.Minute, MaxMsgSize: 4096})
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	p, err := newPublisher(nc, "DOCS", "", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	hdr := []string{"2026-01-02T03:04:05Z"}

	// The payload is the caller's buffer: reusing it right after publish
	// must not change what is stored.
	buf := []byte("first payload")
	sent := time.Now()
	seq, err := p.publish("docs.a", "id-1", hdr, nil, nil, buf, "")
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXX")
	if st, err := awaitOutcome(t, p, seq); st != ackStored || err != nil {
		t.Fatalf("first publish: state %d, err %v; want stored", st, err)
	}
	// The relay's latency metrics are timed by the acknowledgement's
	// arrival, which must not move when the outcome is read later.
	acked := p.ackedAt(seq)
	answered := time.Now()
	if acked.Before(sent) || acked.After(answered) {
		t.Fatalf("acknowledged at %v, outside [%v, %v] of the publish and its outcome", acked, sent, answered)
	}
	// Once the clock has moved past the first read, a time taken at the
	// read would differ.
	for !time.Now().After(answered) {
		runtime.Gosched()
	}
	if again := p.ackedAt(seq); !again.Equal(acked) {
		t.Fatalf("the acknowledgement time moved from %v to %v when read again", acked, again)
	}
	// The newest acknowledgement's time is that same monotonic reading:
	// storedUpTo compares it with the others', which a step of the wall
	// clock between two acknowledgements must not move.
	if last := p.lastAck(); !last.Equal(acked) || !strings.Contains(last.String(), " m=") {
		t.Fatalf("the last acknowledgement at %v, want %v with its monotonic reading", last, acked)
	}
	stream, err := js.Stream(ctx, "DOCS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "first payload" || m.Header.Get(jetstream.MsgIDHeader) != "id-1" || m.Header.Get("Converge-Commit-Time") != hdr[0] {
		t.Fatalf("stored %q with headers %v", m.Data, m.Header)
	}

	cases := []struct {
		name, subject, id string
		reemission        []string
		data              []byte
		want              uint32
		errHas            string
	}{
		{"same id again", "docs.a", "id-1", nil, []byte("first payload"), ackDuplicate, ""},
		{"a re-emission of it", "docs.a", "id-1.7", []string{"7"}, []byte("first payload"), ackStored, ""},
		{"the re-emission again", "docs.a", "id-1.7", []string{"7"}, []byte("first payload"), ackDuplicate, ""},
		{"no stream on the subject", "nowhere.a", "id-2", nil, []byte("x"), ackFailed, "no responders"},
		{"another stream's subject", "other.a", "id-3", nil, []byte("x"), ackFailed, `acknowledged by stream "OTHER"`},
		{"refused by the stream", "docs.b", "id-4", nil, make([]byte, 8192), ackFailed, "stream refused the message"},
		// Eight publishes through four slots: slots are reused.
		{"after errors, stored again", "docs.c", "id-5", nil, []byte("y"), ackStored, ""},
		{"and again", "docs.d", "id-6", nil, []byte("z"), ackStored, ""},
	}
	for _, c := range cases {
		seq, err := p.publish(c.subject, c.id, hdr, c.reemission, nil, c.data, "")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		st, err := awaitOutcome(t, p, seq)
		if st != c.want {
			t.Fatalf("%s: state %d (err %v), want %d", c.name, st, err, c.want)
		}
		if c.errHas == "" && err != nil || c.errHas != "" && (err == nil || !strings.Contains(err.Error(), c.errHas)) {
			t.Fatalf("%s: err %v, want one containing %q", c.name, err, c.errHas)
		}
		if c.errHas == "no responders" && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("%s: %v does not wrap nats.ErrNoResponders", c.name, err)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4 {
		t.Fatalf("stream holds %d messages, want 4", info.State.Msgs)
	}
	// The re-emission carries its header; the next message does not.
	for seq, want := range map[uint64][2]string{2: {"id-1.7", "7"}, 3: {"id-5", ""}} {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) != want[0] || m.Header.Get(contract.HeaderReemission) != want[1] || m.Header.Get(contract.HeaderCommitTime) != hdr[0] {
			t.Fatalf("message %d has headers %v, want id %s and re-emission %q", seq, m.Header, want[0], want[1])
		}
	}
}

// Replies that are not a PubAck of this publisher's stream never count as
// stored, and stray subjects on the inbox are ignored.
func TestPublisherParseAck(t *testing.T) {
	p := &publisher{stream: "DOCS", prefix: "_INBOX.x.", slots: make([]ackSlot, 2), wake: make(chan struct{}, 1)}
	cases := []struct {
		data      string
		want      uint32
		seq       uint64
		wrongLast bool
	}{
		{`{"stream":"DOCS","seq":7}`, ackStored, 7, false},
		{`{"stream":"DOCS","seq":1234567}`, ackStored, 1234567, false},
		{`{"stream":"DOCS","seq":7,"duplicate":true}`, ackDuplicate, 7, false},
		{`{"stream":"DOCS","seq":7,"duplicate": true}`, ackDuplicate, 7, false}, // the server's spelling
		{`{"stream":"DOCS","seq":7,"duplicate": false}`, ackStored, 7, false},
		{`{"stream":"DOCS","domain":"hub","seq":7}`, ackStored, 7, false},
		{`{"stream":"DOCS2","seq":7}`, ackFailed, 0, false},
		{`{"stream":"DOC","seq":7}`, ackFailed, 0, false},
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"DOCS","seq":0}`, ackFailed, 0, false},
		{`{"stream":"DOCS","seq":0,"error":{"code":400,"description":"bad"}}`, ackFailed, 0, false},
		{`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 41"},"stream":"DOCS","seq":0}`, ackFailed, 0, true},
		{`not json`, ackFailed, 0, false},
		{``, ackFailed, 0, false},
	}
	for _, c := range cases {
		got, seq, err := parseAck(&nats.Msg{Subject: "_INBOX.x.1", Data: []byte(c.data)}, p.stream)
		var wl *wrongLastError
		if got != c.want || seq != c.seq || (got == ackFailed) != (err != nil) || errors.As(err, &wl) != c.wrongLast {
			t.Errorf("parseAck(%q) = %d, seq %d, %v; want %d, seq %d (a wrong last sequence: %v)", c.data, got, seq, err, c.want, c.seq, c.wrongLast)
		}
	}
	for _, subj := range []string{"_INBOX.x.2", "_INBOX.x.-1", "_INBOX.x.a", "_INBOX.y.0"} {
		p.onAck(&nats.Msg{Subject: subj, Data: []byte(`{"stream":"DOCS","seq":1}`)})
	}
	if p.slots[0].state.Load() != ackWaiting || p.slots[1].state.Load() != ackWaiting {
		t.Fatal("a reply on a subject outside the slots was recorded")
	}
	p.onAck(&nats.Msg{Subject: "_INBOX.x.1", Data: []byte(`{"stream":"DOCS","seq":1}`)})
	if p.slots[1].state.Load() != ackStored {
		t.Fatal("the reply for slot 1 was not recorded")
	}
}

// Once the connection was lost, a session's publisher sends nothing more,
// even after the connection is back: what the old connection had not
// delivered is lost, and a newer message reaching the new server first
// would be stored before an older one the next session publishes again.
// A publish while reconnecting fails on the relay's own connection (no
// reconnect buffer) rather than waiting in a buffer for the new server.
func TestPublisherStopsOnceTheConnectionWasLost(t *testing.T) {
	n, err := testenv.StartNATSAt(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	current := n
	t.Cleanup(func() { current.Shutdown() })
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectBufSize(-1),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DOCS", Subjects: []string{"docs.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p, err := newPublisher(nc, "DOCS", "", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	hdr := []string{"2026-01-02T03:04:05Z"}
	seq, err := p.publish("docs.a", "id-1", hdr, nil, nil, []byte("v1"), "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := awaitOutcome(t, p, seq); st != ackStored {
		t.Fatalf("before the restart: state %d, err %v", st, err)
	}

	n.Shutdown()
	testenv.Eventually(t, "the connection to notice", 5*time.Second, func() bool { return nc.Status() != nats.CONNECTED })
	if _, err := p.publish("docs.a", "id-2", hdr, nil, nil, []byte("v2"), ""); !errors.Is(err, errReconnected) {
		t.Fatalf("publish while reconnecting: %v, want %v", err, errReconnected)
	}
	// Not the publisher's own check: the connection itself refuses.
	if err := nc.Publish("docs.a", []byte("v2")); !errors.Is(err, nats.ErrReconnectBufExceeded) {
		t.Fatalf("a plain publish while reconnecting: %v, want %v", err, nats.ErrReconnectBufExceeded)
	}
	restarted, err := testenv.StartNATSAt(n.StoreDir, n.Port)
	if err != nil {
		t.Fatal(err)
	}
	current = restarted
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect within 10s")
	}
	if !p.reconnected() {
		t.Fatal("the publisher does not know the connection was re-established")
	}
	if _, err := p.publish("docs.a", "id-3", hdr, nil, nil, []byte("v3"), ""); !errors.Is(err, errReconnected) {
		t.Fatalf("publish after the reconnect, same session: %v, want %v", err, errReconnected)
	}
	// The next session's publisher publishes again.
	p2, err := newPublisher(nc, "DOCS", "", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.close()
	seq, err = p2.publish("docs.a", "id-3", hdr, nil, nil, []byte("v3"), "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := awaitOutcome(t, p2, seq); st != ackStored {
		t.Fatalf("next session: state %d, err %v", st, err)
	}
	stream, err := js.Stream(ctx, "DOCS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d messages, want 2 (v1, then v3 from the next session)", info.State.Msgs)
	}
}

// TestPublisherKeepsTheStreamInPublishOrder: once chained, each publish
// to the documents' stream expects the sequence its predecessor gets as
// the stream's last. A publish lost in flight makes the stream refuse
// every later one instead of storing it before the lost one; a session
// publishing again from an older position, careful (unchained) until one
// of its events is stored, has its copies dropped as duplicates, and
// chains from the first it stores.
func TestPublisherKeepsTheStreamInPublishOrder(t *testing.T) {
	nc, _, s := withStream(t, jetstream.StreamConfig{Name: "DOCS", Subjects: []string{"docs.>"}, Duplicates: time.Minute})
	ctx := context.Background()
	hdr := []string{"2026-01-02T03:04:05Z"}
	publish := func(p *publisher, id string) (uint64, uint32, error) {
		t.Helper()
		seq, err := p.publish("docs."+id, id, hdr, nil, nil, []byte(id), "")
		if err != nil {
			t.Fatal(err)
		}
		st, err := awaitOutcome(t, p, seq)
		return seq, st, err
	}
	first, err := newPublisher(nc, "DOCS", "", 8)
	if err != nil {
		t.Fatal(err)
	}
	seq, st, err := publish(first, "e1")
	if st != ackStored {
		t.Fatalf("e1: state %d, err %v; want stored", st, err)
	}
	first.chain(seq)
	if first.lastSeq != 1 {
		t.Fatalf("chained after e1 at sequence %d, want 1", first.lastSeq)
	}
	if _, st, err := publish(first, "e2"); st != ackStored {
		t.Fatalf("e2: state %d, err %v; want stored", st, err)
	}
	// e3 was lost on its way: the session believes it published it.
	first.lastSeq++
	_, st, err = publish(first, "e4")
	var wl *wrongLastError
	if st != ackFailed || !errors.As(err, &wl) || wl.last != "2" {
		t.Fatalf("e4 after a lost e3: state %d, err %v; want refused, the stream's last sequence being 2", st, err)
	}
	if !first.broken.Load() {
		t.Fatal("the refusal did not mark the session broken")
	}
	if _, st, err = publish(first, "e5"); st != ackFailed || !errors.As(err, &wl) {
		t.Fatalf("e5: state %d, err %v; want refused too", st, err)
	}
	first.close()

	// The next session publishes again from e2: careful, a duplicate,
	// then e3 stored, and chained from it e4 and e5.
	next, err := newPublisher(nc, "DOCS", "", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	if _, st, err := publish(next, "e2"); st != ackDuplicate {
		t.Fatalf("e2 again: state %d, err %v; want a duplicate", st, err)
	}
	seq, st, err = publish(next, "e3")
	if st != ackStored {
		t.Fatalf("e3: state %d, err %v; want stored", st, err)
	}
	next.chain(seq)
	for _, id := range []string{"e4", "e5"} {
		if _, st, err := publish(next, id); st != ackStored {
			t.Fatalf("next session, %s: state %d, err %v; want stored", id, st, err)
		}
	}
	var got []string
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Data))
	}
	if strings.Join(got, " ") != "e1 e2 e3 e4 e5" {
		t.Fatalf("the stream holds %v; want e1 to e5 once each, in order", got)
	}
}
