package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// dlqFixture is a NATS server with the streams of a pipeline and dead
// letters of three consumers, built the way the consumers build them.
type dlqFixture struct {
	url    string
	js     jetstream.JetStream
	dlq    jetstream.Stream
	docs   jetstream.Stream
	ingest jetstream.Stream
	// CONVERGE_DLQ sequences by consumer, in order.
	seqs map[string][]uint64
	// The original data of each dead letter, by CONVERGE_DLQ sequence.
	data map[uint64][]byte
}

const dlqCommitTime = "2026-01-02T03:04:05.123456789Z"

func newDLQFixture(t *testing.T) *dlqFixture {
	t.Helper()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	fx := &dlqFixture{url: n.URL, js: js, seqs: map[string][]uint64{}, data: map[uint64][]byte{}}
	if fx.docs, err = relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := writer.NewIngest(js, nil, writer.IngestConfig{}, nil, nil).EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if fx.ingest, err = js.Stream(ctx, writer.IngestStream); err != nil {
		t.Fatal(err)
	}
	if err := deadletter.EnsureStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if fx.dlq, err = js.Stream(ctx, deadletter.Stream); err != nil {
		t.Fatal(err)
	}

	upserted := encodeEvent(t, contract.NewUpsertedEvent(contract.Document{Key: "docs/a", Version: 3, Title: "A", Body: "alpha"}, []string{"alpha"}))
	withdrawn := encodeEvent(t, contract.NewWithdrawnEvent("docs/c", 2))
	garbage := []byte("\x00\xffnot json")
	fx.deadLetter(t, "index", contract.Subject("docs/a"), upserted, "store_rejected")
	fx.deadLetter(t, "graph", contract.Subject("docs/a"), upserted, "graph_rejected")
	fx.deadLetter(t, "index", contract.Subject("docs/b"), garbage, "invalid_json")
	fx.deadLetter(t, "ingest", contract.IngestSubject("in/1"), []byte(`{"key":"in/1","version":1,"body":"one"}`), "invalid_document")
	fx.deadLetter(t, "index", contract.Subject("docs/c"), withdrawn, "store_rejected")
	fx.deadLetter(t, "ingest", contract.IngestSubject("in/2"), []byte(`{"key":"in/2","version":7,"body":"two"}`), "invalid_document")
	return fx
}

func encodeEvent(t *testing.T, ev contract.Event) []byte {
	t.Helper()
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// deadLetter publishes data on subject as its producer would, receives it
// as consumer, and dead-letters it with code as the consumer does.
func (fx *dlqFixture) deadLetter(t *testing.T, consumer, subject string, data []byte, code string) {
	t.Helper()
	ctx := context.Background()
	stream := writer.IngestStream
	if strings.HasPrefix(subject, contract.DocsSubjectPrefix) {
		stream = "CONVERGE_DOCS"
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, dlqCommitTime)
	m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("original-%s-%d", subject, len(fx.data)))
	ack, err := fx.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy}
	if stream != writer.IngestStream { // a work queue delivers from the start only
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, ack.Sequence
	}
	cons, err := fx.js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	dlAck, err := fx.js.PublishMsg(ctx, deadletter.New(consumer, got, code, fmt.Errorf("%s: cannot process %s", code, subject)))
	if err != nil {
		t.Fatal(err)
	}
	if err := got.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fx.js.DeleteConsumer(ctx, stream, cons.CachedInfo().Name); err != nil {
		t.Fatal(err)
	}
	fx.seqs[consumer] = append(fx.seqs[consumer], dlAck.Sequence)
	fx.data[dlAck.Sequence] = data
}

func (fx *dlqFixture) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := dlqCmd(context.Background(), append(args, "-nats-url", fx.url), &out)
	return out.String(), err
}

func (fx *dlqFixture) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := fx.run(t, args...)
	if err != nil {
		t.Fatalf("dlq %v: %v\n%s", args, err, out)
	}
	return out
}

// msgs returns the number of messages in s.
func msgs(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func dlqGone(t *testing.T, fx *dlqFixture, seq uint64) bool {
	t.Helper()
	_, err := fx.dlq.GetMsg(context.Background(), seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}
	return err != nil
}

func TestDlqListAndShow(t *testing.T) {
	fx := newDLQFixture(t)

	out := fx.mustRun(t, "list")
	for _, want := range []string{"CONSUMER", "CODES", "graph_rejected=1", "invalid_json=1 store_rejected=2", "invalid_document=2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("list lacks %q:\n%s", want, out)
		}
	}
	var rep dlqListReport
	if err := json.Unmarshal([]byte(fx.mustRun(t, "list", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Exists || rep.Capped || rep.Scanned != 6 || len(rep.Consumers) != 3 {
		t.Fatalf("list %+v", rep)
	}
	for i, want := range []struct {
		name  string
		n     uint64
		codes map[string]uint64
	}{
		{"graph", 1, map[string]uint64{"graph_rejected": 1}},
		{"index", 3, map[string]uint64{"store_rejected": 2, "invalid_json": 1}},
		{"ingest", 2, map[string]uint64{"invalid_document": 2}},
	} {
		c := rep.Consumers[i]
		if c.Consumer != want.name || c.Subject != "converge.dlq."+want.name || c.DeadLetters != want.n || fmt.Sprint(c.Codes) != fmt.Sprint(want.codes) {
			t.Errorf("consumer %d: %+v, want %+v", i, c, want)
		}
		if c.Oldest.IsZero() || c.Newest.Before(c.Oldest) || (want.n > 1 && !c.Newest.After(c.Oldest)) {
			t.Errorf("%s: oldest %v newest %v", c.Consumer, c.Oldest, c.Newest)
		}
	}

	// Beyond the scan cap, counts stay exact and codes say they are partial.
	capped, err := collectDLQList(context.Background(), fx.js, fx.dlq, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !capped.Capped || capped.Scanned != 4 || capped.Consumers[1].DeadLetters != 3 {
		t.Fatalf("capped list %+v", capped)
	}
	var cappedOut bytes.Buffer
	printDLQList(&cappedOut, capped)
	if !strings.Contains(cappedOut.String(), "first 4 dead letters only") {
		t.Fatalf("capped list does not say so:\n%s", cappedOut.String())
	}

	// Flags may follow the consumer.
	out = fx.mustRun(t, "show", "index")
	idx := fx.seqs["index"]
	for _, want := range []string{
		"dead letters of index (converge.dlq.index): 3",
		fmt.Sprintf("#%d  ", idx[0]),
		"store_rejected",
		"original: " + contract.Subject("docs/a") + " (CONVERGE_DOCS seq 1)",
		`payload:  event document.upserted key "docs/a" version 3`,
		`payload:  event document.withdrawn key "docs/c" version 2`,
		`payload:  10 bytes: "\x00\xffnot json"`,
		"reason:   invalid_json: cannot process " + contract.Subject("docs/b"),
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "graph_rejected") {
		t.Fatalf("show index shows another consumer's dead letter:\n%s", out)
	}

	var show dlqShowReport
	if err := json.Unmarshal([]byte(fx.mustRun(t, "show", "--json", "ingest", "--limit", "1")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Consumer != "ingest" || show.Total != 2 || !show.Truncated || len(show.DeadLetters) != 1 {
		t.Fatalf("show --limit 1: %+v", show)
	}
	e := show.DeadLetters[0]
	if e.Seq != fx.seqs["ingest"][0] || e.Code != "invalid_document" || e.OriginalSubj != contract.IngestSubject("in/1") ||
		e.OriginalStream != writer.IngestStream || e.OriginalSeq == 0 || e.Time.IsZero() || !strings.Contains(e.Reason, "cannot process") {
		t.Fatalf("entry %+v", e)
	}
	// An ingest document is not an event, but its key is worth showing.
	if e.Payload.Event || e.Payload.Key != "in/1" || e.Payload.Version != 1 || !strings.HasPrefix(e.Payload.Head, `"{\"key\":\"in/1\"`) {
		t.Fatalf("payload %+v", e.Payload)
	}
	if err := json.Unmarshal([]byte(fx.mustRun(t, "show", "graph", "--json")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Truncated || len(show.DeadLetters) != 1 || !show.DeadLetters[0].Payload.Event || show.DeadLetters[0].Payload.Kind != string(contract.KindUpserted) {
		t.Fatalf("show graph: %+v", show)
	}
	// Reading leaves no consumer behind on the stream.
	info, err := fx.dlq.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 || info.State.Msgs != 6 {
		t.Fatalf("after reading, %s has %d consumers and %d messages", deadletter.Stream, info.State.Consumers, info.State.Msgs)
	}
}

func TestDlqRedriveSelected(t *testing.T) {
	ctx := context.Background()
	fx := newDLQFixture(t)
	idx := fx.seqs["index"]
	docsBefore := msgs(t, fx.docs)

	out := fx.mustRun(t, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10))
	if !strings.Contains(out, fmt.Sprintf("redriven #%d to %s (CONVERGE_DOCS seq %d)", idx[0], contract.Subject("docs/a"), docsBefore+1)) ||
		!strings.Contains(out, "1 dead letters of index redriven") {
		t.Fatalf("redrive said:\n%s", out)
	}
	if got := msgs(t, fx.docs); got != docsBefore+1 {
		t.Fatalf("CONVERGE_DOCS holds %d messages, want %d", got, docsBefore+1)
	}
	back, err := fx.docs.GetLastMsgForSubject(ctx, contract.Subject("docs/a"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Data, fx.data[idx[0]]) {
		t.Fatalf("redriven data %q", back.Data)
	}
	if id := back.Header.Get(nats.MsgIdHdr); id != redriveMsgID(idx[0], fx.data[idx[0]]) || !strings.HasPrefix(id, fmt.Sprintf("redrive-%d-", idx[0])) {
		t.Fatalf("redriven Nats-Msg-Id %q", id)
	}
	if back.Header.Get(contract.HeaderCommitTime) != dlqCommitTime {
		t.Fatalf("the original's headers are not kept: %v", back.Header)
	}
	for k := range back.Header {
		if strings.HasPrefix(k, "Converge-Dlq-") {
			t.Fatalf("redriven message carries %s: %v", k, back.Header)
		}
	}
	if !dlqGone(t, fx, idx[0]) {
		t.Fatalf("dead letter #%d still in %s", idx[0], deadletter.Stream)
	}
	if dlqGone(t, fx, idx[1]) || dlqGone(t, fx, idx[2]) || dlqGone(t, fx, fx.seqs["graph"][0]) {
		t.Fatal("a dead letter not selected was deleted")
	}
	if _, err := fx.run(t, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10)); err == nil || !strings.Contains(err.Error(), "no dead letter") {
		t.Fatalf("redrive of a redriven dead letter: %v", err)
	}

	// A redrive that crashed after its republish and before the delete:
	// the retry is dropped by the duplicate window, and the dead letter
	// deleted.
	dl, err := fx.dlq.GetMsg(ctx, idx[2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fx.js.PublishMsg(ctx, redriveMsg(dl), jetstream.WithMsgID(redriveMsgID(idx[2], dl.Data))); err != nil {
		t.Fatal(err)
	}
	docsBefore = msgs(t, fx.docs)
	out = fx.mustRun(t, "redrive", "index", "--seq", strconv.FormatUint(idx[2], 10))
	if !strings.Contains(out, "already there") {
		t.Fatalf("retried redrive said:\n%s", out)
	}
	if got := msgs(t, fx.docs); got != docsBefore {
		t.Fatalf("a retried redrive was stored twice: %d messages, want %d", got, docsBefore)
	}
	if !dlqGone(t, fx, idx[2]) {
		t.Fatal("the retried redrive left its dead letter")
	}

	// Another consumer's dead letter is refused, and nothing is redriven.
	dlqBefore := msgs(t, fx.dlq)
	_, err = fx.run(t, "redrive", "index", "--seq", fmt.Sprintf("%d,%d", idx[1], fx.seqs["graph"][0]))
	if err == nil || !strings.Contains(err.Error(), "not converge.dlq.index") {
		t.Fatalf("redrive of graph's dead letter as index's: %v", err)
	}
	if msgs(t, fx.dlq) != dlqBefore || dlqGone(t, fx, idx[1]) {
		t.Fatal("a refused redrive changed the dead letters")
	}
}

func TestDlqRedriveAll(t *testing.T) {
	ctx := context.Background()
	fx := newDLQFixture(t)
	if got := msgs(t, fx.ingest); got != 0 {
		t.Fatalf("CONVERGE_INGEST holds %d messages before the redrive", got)
	}
	out := fx.mustRun(t, "redrive", "--all", "ingest")
	if !strings.Contains(out, "2 dead letters of ingest redriven") {
		t.Fatalf("redrive --all said:\n%s", out)
	}
	for i, key := range []string{"in/1", "in/2"} {
		m, err := fx.ingest.GetLastMsgForSubject(ctx, contract.IngestSubject(key))
		if err != nil {
			t.Fatalf("%s not back on its subject: %v", key, err)
		}
		seq := fx.seqs["ingest"][i]
		if !bytes.Equal(m.Data, fx.data[seq]) || m.Header.Get(nats.MsgIdHdr) != redriveMsgID(seq, fx.data[seq]) {
			t.Fatalf("%s redriven as %q %v", key, m.Data, m.Header)
		}
		if !dlqGone(t, fx, seq) {
			t.Fatalf("dead letter #%d still there", seq)
		}
	}
	if got := msgs(t, fx.dlq); got != 4 {
		t.Fatalf("%s holds %d dead letters, want the 4 of index and graph", deadletter.Stream, got)
	}
	var rep dlqListReport
	if err := json.Unmarshal([]byte(fx.mustRun(t, "list", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Consumers) != 2 || rep.Consumers[0].Consumer != "graph" || rep.Consumers[1].Consumer != "index" {
		t.Fatalf("list after redrive: %+v", rep.Consumers)
	}
	if _, err := fx.run(t, "redrive", "ingest", "--all"); err == nil || !strings.Contains(err.Error(), `"ingest"`) {
		t.Fatalf("redrive of a consumer without dead letters: %v", err)
	}
}

func TestDlqRedriveDryRunChangesNothing(t *testing.T) {
	fx := newDLQFixture(t)
	dlqBefore, docsBefore := msgs(t, fx.dlq), msgs(t, fx.docs)
	out := fx.mustRun(t, "redrive", "index", "--all", "--dry-run")
	for _, seq := range fx.seqs["index"] {
		if !strings.Contains(out, fmt.Sprintf("would redrive #%d to converge.docs.", seq)) {
			t.Fatalf("dry run does not name #%d:\n%s", seq, out)
		}
	}
	if !strings.Contains(out, "dry run: 3 dead letters of index would be redriven; nothing changed") {
		t.Fatalf("dry run said:\n%s", out)
	}
	fx.mustRun(t, "redrive", "graph", "--seq", strconv.FormatUint(fx.seqs["graph"][0], 10), "--dry-run")
	if msgs(t, fx.dlq) != dlqBefore || msgs(t, fx.docs) != docsBefore {
		t.Fatal("a dry run changed the streams")
	}
}

func TestDlqErrors(t *testing.T) {
	fx := newDLQFixture(t)
	for _, args := range [][]string{{"show", "nope"}, {"redrive", "nope", "--all"}} {
		_, err := fx.run(t, args...)
		if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "graph, index, ingest") {
			t.Errorf("%v: %v, want the known consumers", args, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"redrive", "index"}, "--all"},
		{[]string{"redrive", "index", "--all", "--seq", "1"}, "exclude"},
		{[]string{"redrive", "index", "--seq", "x"}, "not a stream sequence"},
		{[]string{"redrive", "index", "--seq", "999"}, "no dead letter #999"},
		{[]string{"redrive", "--all"}, "one consumer"},
		{[]string{"show"}, "one consumer"},
		{[]string{"show", "index", "graph"}, "one consumer"},
		{[]string{"list", "index"}, "no arguments"},
		{[]string{"sideways"}, "unknown dlq subcommand"},
	} {
		if _, err := fx.run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if got := msgs(t, fx.dlq); got != 6 {
		t.Fatalf("refused commands changed %s: %d dead letters", deadletter.Stream, got)
	}

	t.Setenv(config.EnvNATSURL, "")
	var out bytes.Buffer
	if err := dlqCmd(context.Background(), []string{"list"}, &out); err == nil || !strings.Contains(err.Error(), config.EnvNATSURL) {
		t.Fatalf("missing NATS URL: %v", err)
	}
	if err := dlqCmd(context.Background(), nil, &out); err != nil || !strings.Contains(out.String(), "operator action") {
		t.Fatalf("help: %v %q", err, out.String())
	}
}

func TestDlqWithoutStream(t *testing.T) {
	n := testenv.StartNATS(t)
	var out bytes.Buffer
	if err := dlqCmd(context.Background(), []string{"list", "-nats-url", n.URL}, &out); err != nil || !strings.Contains(out.String(), "does not exist") {
		t.Fatalf("list: %v %q", err, out.String())
	}
	err := dlqCmd(context.Background(), []string{"show", "index", "-nats-url", n.URL}, &out)
	if err == nil || !strings.Contains(err.Error(), "no consumer has any") {
		t.Fatalf("show: %v", err)
	}
}

// A dead letter without its original subject, or whose original stream no
// longer holds that subject, is not redriven: the command stops naming it,
// and the dead letter stays.
func TestDlqRedriveRefusals(t *testing.T) {
	fx := newDLQFixture(t)
	ctx := context.Background()
	publish := func(h nats.Header) uint64 {
		t.Helper()
		m := nats.NewMsg(contract.DLQSubject("index"))
		m.Header = h
		m.Data = []byte(`{"not":"an event"}`)
		ack, err := fx.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	noSubject := publish(nats.Header{deadletter.HeaderStream: {"CONVERGE_DOCS"}})
	elsewhere := publish(nats.Header{deadletter.HeaderSubject: {contract.Subject("doc/1")}, deadletter.HeaderStream: {"SOME_OTHER_STREAM"}})
	before := msgs(t, fx.dlq)

	_, err := fx.run(t, "redrive", "index", "--seq", strconv.FormatUint(noSubject, 10))
	if err == nil || !strings.Contains(err.Error(), deadletter.HeaderSubject) || !strings.Contains(err.Error(), fmt.Sprintf("#%d", noSubject)) {
		t.Errorf("redrive without the subject header: %v; want an error naming the header and the dead letter", err)
	}
	_, err = fx.run(t, "redrive", "index", "--seq", strconv.FormatUint(elsewhere, 10))
	if err == nil || !strings.Contains(err.Error(), "SOME_OTHER_STREAM") {
		t.Errorf("redrive into a stream that no longer holds the subject: %v; want an error naming it", err)
	}
	if got := msgs(t, fx.dlq); got != before || dlqGone(t, fx, noSubject) || dlqGone(t, fx, elsewhere) {
		t.Fatalf("refused redrives changed %s: %d dead letters, want %d", deadletter.Stream, got, before)
	}
}
