package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	publishEvents = 200_000
	publishKeys   = 50_000
	publishTxRows = 100
)

// publishMode is one way of getting the backlog's events into the stream.
type publishMode struct {
	name    string
	history int64 // the stream's messages per subject
	// window bounds the publishes awaiting acknowledgement.
	window int
	// commitTime: the Converge-Commit-Time header on every message, as the
	// relay sends it.
	commitTime bool
	// run publishes every event of events and returns once the stream has
	// acknowledged them all.
	run func(b *testing.B, nc *nats.Conn, m publishMode, events []benchEvent)
	// stream adjusts the stream's configuration.
	stream func(*jetstream.StreamConfig)
}

type benchEvent struct {
	subject, id string
	payload     []byte
}

// BenchmarkPublishModes publishes the same 200,000 1 KB events (50,000
// subjects, as BenchmarkRelayBacklog's backlog) into a fresh file-backed
// stream configured as the relay's, in several ways one after the other in
// one run, with no Postgres in the way: the relay's publisher (an async
// window with one acknowledgement per message) at several windows, with the
// per-subject limit off and at the relay's default (4), with and without the
// commit-time header, and the server's fast batch (one acknowledgement per
// up to 500 messages) and atomic batches (one per 100-row transaction). It
// reports each mode's events/s and this process's CPU per event (the
// embedded nats-server, mostly).
func BenchmarkPublishModes(b *testing.B) {
	events := make([]benchEvent, publishEvents)
	pad := strings.Repeat("converge relay backlog ", 37)
	for i := range events {
		key := "doc-" + strconv.Itoa(i%publishKeys)
		events[i] = benchEvent{subject: contract.Subject(key), id: uuid.NewString(),
			payload: fmt.Appendf(nil, `{"schema":"converge.event.v1","kind":"document.upserted","key":%q,"version":%d,"title":"backlog document %d","links":[],"tags":[],"meta":{},"chunks":[{"ordinal":0,"text":%q}]}`,
				key, i/publishKeys+1, i, pad)}
	}
	modes := []publishMode{
		{name: "window-4096", history: -1, window: 4096, commitTime: true, run: publishWindow},
		{name: "window-4096-history-4", history: 4, window: 4096, commitTime: true, run: publishWindow},
		{name: "window-4096-msgid-only", history: -1, window: 4096, run: publishWindow},
		{name: "window-1024", history: -1, window: 1024, commitTime: true, run: publishWindow},
		{name: "window-16384", history: -1, window: 16384, commitTime: true, run: publishWindow},
		{name: "fast-batch", history: -1, window: 4096, commitTime: true, run: publishFastBatch,
			stream: func(c *jetstream.StreamConfig) { c.AllowBatchPublish = true }},
		{name: "atomic-batch-100", history: -1, window: 4096, commitTime: true, run: publishAtomic,
			stream: func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = true }},
	}
	// The modes take turns, each round in another order, so that the
	// machine's load falls on all of them alike; use -benchtime 1x.
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("CONVERGE_BENCH_PUBLISH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	rates := make([][]float64, len(modes))
	cpus := make([][]float64, len(modes))
	var log strings.Builder
	for i := 0; i < b.N; i++ {
		for r := range rounds {
			for k := range modes {
				j := (r + k) % len(modes)
				e, c := publishOnce(b, modes[j], events)
				rates[j] = append(rates[j], publishEvents/e.Seconds())
				cpus[j] = append(cpus[j], float64(c.Microseconds())/publishEvents)
				fmt.Fprintf(&log, "round %d: %s %.0f events/s, %.1f µs CPU/event\n", r+1, modes[j].name, rates[j][len(rates[j])-1], cpus[j][len(cpus[j])-1])
			}
		}
	}
	// The medians first: a benchmark's log is cut after a few lines.
	var sum strings.Builder
	for j, m := range modes {
		fmt.Fprintf(&sum, "%-24s median %6.0f events/s, %5.1f µs CPU/event (%.2fx the CPU of %s)\n", m.name, median(rates[j]), median(cpus[j]),
			median(cpus[j])/median(cpus[0]), modes[0].name)
		b.ReportMetric(median(cpus[j]), m.name+"_cpu_µs/event")
	}
	b.Log("\n" + sum.String() + log.String())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// publishOnce publishes events into a fresh server's stream and returns the
// time until all were acknowledged and this process's CPU meanwhile.
func publishOnce(b *testing.B, m publishMode, events []benchEvent) (time.Duration, time.Duration) {
	b.Helper()
	b.StopTimer()
	dir, err := os.MkdirTemp("", "relay-publish-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	n, err := testenv.StartNATSAt(dir, -1)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Shutdown()
	nc, err := nats.Connect(n.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	sc := jetstream.StreamConfig{Name: contract.DocsStream, Subjects: []string{contract.DocsSubjectPrefix + ">"},
		Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute, MaxMsgsPerSubject: m.history,
		MaxMsgSize: contract.MaxMessageBytes, AllowDirect: true}
	if m.stream != nil {
		m.stream(&sc)
	}
	stream, err := js.CreateStream(context.Background(), sc)
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := processCPU()
	start := time.Now()
	b.StartTimer()
	m.run(b, nc, m, events)
	b.StopTimer()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	info, err := stream.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != uint64(len(events)) {
		b.Fatalf("%s: the stream holds %d messages, want %d", m.name, info.State.Msgs, len(events))
	}
	return elapsed, cpu
}

var benchCommitTime = []string{time.Date(2026, 12, 1, 10, 11, 12, 123456000, time.UTC).Format(time.RFC3339Nano)}

// publishWindow is the relay's way: its publisher, acknowledgements
// consumed in order, at most m.window in flight.
func publishWindow(b *testing.B, nc *nats.Conn, m publishMode, events []benchEvent) {
	p, err := newPublisher(nc, contract.DocsStream, "", m.window)
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	var hdr []string
	if m.commitTime {
		hdr = benchCommitTime
	}
	var head uint64
	awaitHead := func() {
		for {
			st, err := p.outcome(head)
			switch st {
			case ackWaiting:
				select {
				case <-p.wake:
				case <-time.After(10 * time.Second):
					b.Fatalf("%s: no acknowledgement of %d within 10s", m.name, head)
				}
				continue
			case ackFailed:
				b.Fatalf("%s: %v", m.name, err)
			}
			head++
			return
		}
	}
	for _, e := range events {
		if p.next-head >= uint64(m.window) {
			awaitHead()
		}
		if _, err := p.publish(e.subject, e.id, hdr, nil, nil, e.payload, ""); err != nil {
			b.Fatal(err)
		}
	}
	for head < p.next {
		awaitHead()
	}
}

// batchReply is a fast batch's flow message or final acknowledgement.
type batchReply struct {
	Type   string          `json:"type"`
	Seq    uint64          `json:"seq"`
	Stream string          `json:"stream"`
	Count  uint64          `json:"count"`
	Error  json.RawMessage `json:"error"`
}

// publishFastBatch publishes every event in one fast batch (gaps fail the
// batch), at most m.window beyond the last flow acknowledgement, and ends
// it with an end-of-batch commit.
func publishFastBatch(b *testing.B, nc *nats.Conn, m publishMode, events []benchEvent) {
	prefix := nats.NewInbox()
	replies := make(chan batchReply, 1024)
	sub, err := nc.Subscribe(prefix+".>", func(msg *nats.Msg) {
		var r batchReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			r.Type, r.Error = "unreadable", json.RawMessage(strconv.Quote(string(msg.Data)))
		}
		replies <- r
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	id := nats.NewInbox()[len(nats.InboxPrefix):]
	base := prefix + "." + id + ".500.fail."
	var acked uint64
	done := false
	handle := func(r batchReply) {
		switch {
		case len(r.Error) > 0 || r.Type == "gap" || r.Type == "err" || r.Type == "unreadable":
			b.Fatalf("%s: %s %s", m.name, r.Type, r.Error)
		case r.Type == "ack":
			acked = max(acked, r.Seq)
		case r.Stream != "":
			acked, done = max(acked, r.Count), true
		}
	}
	wait := func() {
		select {
		case r := <-replies:
			handle(r)
		case <-time.After(10 * time.Second):
			b.Fatalf("%s: no flow acknowledgement within 10s (acknowledged %d)", m.name, acked)
		}
	}
	hdr := nats.Header{jetstream.MsgIDHeader: []string{""}}
	if m.commitTime {
		hdr[contract.HeaderCommitTime] = benchCommitTime
	}
	msg := nats.Msg{Header: hdr}
	for i, e := range events {
		seq := uint64(i + 1)
		for seq-acked > uint64(m.window) {
			wait()
		}
		op := "1"
		if seq == 1 {
			op = "0"
		}
		hdr[jetstream.MsgIDHeader][0] = e.id
		msg.Subject, msg.Reply, msg.Data = e.subject, base+strconv.FormatUint(seq, 10)+"."+op+".$FI", e.payload
		if err := nc.PublishMsg(&msg); err != nil {
			b.Fatal(err)
		}
	drained:
		for {
			select {
			case r := <-replies:
				handle(r)
			default:
				break drained
			}
		}
	}
	eob := nats.Msg{Subject: events[0].subject, Reply: base + strconv.Itoa(len(events)+1) + ".3.$FI"}
	if err := nc.PublishMsg(&eob); err != nil {
		b.Fatal(err)
	}
	for !done {
		wait()
	}
	if acked != uint64(len(events)) {
		b.Fatalf("%s: the batch's acknowledgement counts %d, want %d", m.name, acked, len(events))
	}
}

// publishAtomic publishes each 100-row transaction as one atomic batch,
// acknowledged once at its commit, with at most m.window messages (and the
// server's 50 batches) in flight.
func publishAtomic(b *testing.B, nc *nats.Conn, m publishMode, events []benchEvent) {
	prefix := nats.NewInbox() + "."
	acks := make(chan []byte, 1024)
	sub, err := nc.Subscribe(prefix+"*", func(msg *nats.Msg) { acks <- msg.Data })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	inflight := 0
	maxBatches := min(m.window/publishTxRows, 40)
	wait := func() {
		select {
		case d := <-acks:
			var r batchReply
			if err := json.Unmarshal(d, &r); err != nil || len(r.Error) > 0 || r.Stream == "" {
				b.Fatalf("%s: acknowledgement %s", m.name, d)
			}
			inflight--
		case <-time.After(10 * time.Second):
			b.Fatalf("%s: no acknowledgement within 10s", m.name)
		}
	}
	hdr := nats.Header{jetstream.MsgIDHeader: []string{""}, "Nats-Batch-Id": []string{""}, "Nats-Batch-Sequence": []string{""}}
	if m.commitTime {
		hdr[contract.HeaderCommitTime] = benchCommitTime
	}
	msg := nats.Msg{Header: hdr}
	for tx := 0; tx*publishTxRows < len(events); tx++ {
		for inflight >= maxBatches {
			wait()
		}
		batch := "b" + strconv.Itoa(tx)
		rows := events[tx*publishTxRows : min(len(events), (tx+1)*publishTxRows)]
		for i, e := range rows {
			hdr[jetstream.MsgIDHeader][0] = e.id
			hdr["Nats-Batch-Id"][0] = batch
			hdr["Nats-Batch-Sequence"][0] = strconv.Itoa(i + 1)
			msg.Subject, msg.Reply, msg.Data = e.subject, "", e.payload
			if i == len(rows)-1 {
				hdr["Nats-Batch-Commit"] = []string{"1"}
				msg.Reply = prefix + batch
			}
			if err := nc.PublishMsg(&msg); err != nil {
				b.Fatal(err)
			}
			delete(hdr, "Nats-Batch-Commit")
		}
		inflight++
	}
	for inflight > 0 {
		wait()
	}
}

// processCPU is the user plus system time this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
