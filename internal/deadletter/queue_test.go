package deadletter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/deadletter/deadlettertest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

func open(t *testing.T, fx *deadlettertest.Fixture) *deadletter.Queue {
	t.Helper()
	q, err := deadletter.Open(context.Background(), fx.JS)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestSummarize(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	sum, err := q.Summarize(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Stream != deadletter.Stream || !sum.Exists || sum.Capped || sum.Scanned != 6 || len(sum.Consumers) != 3 {
		t.Fatalf("summary %+v", sum)
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
		c := sum.Consumers[i]
		if c.Consumer != want.name || c.Subject != "converge.dlq."+want.name || c.DeadLetters != want.n || fmt.Sprint(c.Codes) != fmt.Sprint(want.codes) {
			t.Errorf("consumer %d: %+v, want %+v", i, c, want)
		}
		if c.Oldest.IsZero() || c.Newest.Before(c.Oldest) || (want.n > 1 && !c.Newest.After(c.Oldest)) {
			t.Errorf("%s: oldest %v newest %v", c.Consumer, c.Oldest, c.Newest)
		}
	}

	// Beyond the scan cap, counts stay exact and codes say they are partial.
	capped, err := q.Summarize(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !capped.Capped || capped.Scanned != 4 || capped.Consumers[1].DeadLetters != 3 {
		t.Fatalf("capped summary %+v", capped)
	}
	if n, err := q.Count(ctx, "index"); err != nil || n != 3 {
		t.Fatalf("count of index: %d, %v", n, err)
	}

	// Reading leaves no consumer behind on the stream, and every message.
	info, err := fx.DLQ.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 || info.State.Msgs != 6 {
		t.Fatalf("after reading, %s has %d consumers and %d messages", deadletter.Stream, info.State.Consumers, info.State.Msgs)
	}
}

func TestRead(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	p, err := q.Read(ctx, "index", 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.Consumer != "index" || p.Subject != contract.DLQSubject("index") || p.Total != 3 || p.Truncated || len(p.DeadLetters) != 3 {
		t.Fatalf("page %+v", p)
	}
	for i, want := range []struct {
		code, subject, payload string
	}{
		{"store_rejected", contract.Subject("docs/a"), `event document.upserted key "docs/a" version 3`},
		{"invalid_json", contract.Subject("docs/b"), `10 bytes: "\x00\xffnot json"`},
		{"store_rejected", contract.Subject("docs/c"), `event document.withdrawn key "docs/c" version 2`},
	} {
		e := p.DeadLetters[i]
		if e.Seq != fx.Seqs["index"][i] || e.Code != want.code || e.OriginalSubj != want.subject || e.OriginalStream != contract.DocsStream ||
			e.OriginalSeq == 0 || e.Time.IsZero() || e.Reason != want.code+": cannot process "+want.subject || e.Payload.String() != want.payload {
			t.Errorf("dead letter %d: %+v (payload %s), want %+v", i, e, e.Payload, want)
		}
	}

	p, err = q.Read(ctx, "ingest", 1)
	if err != nil {
		t.Fatal(err)
	}
	if p.Total != 2 || !p.Truncated || len(p.DeadLetters) != 1 {
		t.Fatalf("ingest, limit 1: %+v", p)
	}
	e := p.DeadLetters[0]
	if e.Seq != fx.Seqs["ingest"][0] || e.OriginalSubj != contract.IngestSubject("in/1") || e.OriginalStream != writer.IngestStream {
		t.Fatalf("entry %+v", e)
	}
	// An ingest document is not an event, but its key is worth showing.
	if e.Payload.Event || e.Payload.Key != "in/1" || e.Payload.Version != 1 || !strings.HasPrefix(e.Payload.Head, `"{\"key\":\"in/1\"`) ||
		!strings.HasPrefix(e.Payload.String(), `not a valid event: key "in/1" version 1, `) {
		t.Fatalf("payload %+v", e.Payload)
	}

	_, err = q.Read(ctx, "nope", 0)
	var unknown *deadletter.UnknownConsumerError
	if !errors.As(err, &unknown) || unknown.Consumer != "nope" || fmt.Sprint(unknown.Known) != "[graph index ingest]" ||
		!strings.Contains(err.Error(), "graph, index, ingest") {
		t.Fatalf("read of a consumer without dead letters: %v", err)
	}
}

func TestDescribePayloadTruncatesItsHead(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 100)
	p := deadletter.DescribePayload(data)
	if p.Bytes != 100 || p.Event || p.Head != `"`+strings.Repeat("x", 64)+`"...` {
		t.Fatalf("payload %+v", p)
	}
}

func TestRedriveSelected(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	idx := fx.Seqs["index"]
	docsBefore := deadlettertest.Msgs(t, fx.Docs)
	w := newFakeWriter(map[string]int64{"docs/a": 5})

	var got []deadletter.Redriven
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[0], idx[0]}, Writer: w}, func(r deadletter.Redriven) { got = append(got, r) })
	if err != nil || n != 1 || len(got) != 1 {
		t.Fatalf("redrive: %d, %v, %+v", n, err, got)
	}
	if r := got[0]; r.Seq != idx[0] || r.Path != deadletter.Reemit || r.Subject != contract.Subject("docs/a") || r.Key != "docs/a" ||
		r.Version != 5 || r.Emission != 1 || r.EventID == (uuid.UUID{}) || r.Code != "store_rejected" || r.Payload.Version != 3 || r.Kept != "" || r.StreamSeq != 0 {
		t.Fatalf("redriven %+v", r)
	}
	if fmt.Sprint(w.requests) != "[[docs/a]]" {
		t.Fatalf("re-emission requests %v", w.requests)
	}
	// The redrive itself publishes nothing to the documents' stream: the
	// relay does, from the outbox.
	if got := deadlettertest.Msgs(t, fx.Docs); got != docsBefore {
		t.Fatalf("%s holds %d messages, want %d", contract.DocsStream, got, docsBefore)
	}
	if !fx.Gone(t, idx[0]) {
		t.Fatalf("dead letter #%d still in %s", idx[0], deadletter.Stream)
	}
	if fx.Gone(t, idx[1]) || fx.Gone(t, idx[2]) || fx.Gone(t, fx.Seqs["graph"][0]) {
		t.Fatal("a dead letter not selected was deleted")
	}
	if _, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[0]}, Writer: w}, nil); !errors.Is(err, jetstream.ErrMsgNotFound) ||
		!strings.Contains(err.Error(), fmt.Sprintf("no dead letter #%d", idx[0])) {
		t.Fatalf("redrive of a redriven dead letter: %v", err)
	}

	// Another consumer's dead letter is refused, and nothing is redriven,
	// not even the selected dead letter that is the consumer's.
	dlqBefore := deadlettertest.Msgs(t, fx.DLQ)
	n, err = q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[2], fx.Seqs["graph"][0]}, Writer: w}, nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "not converge.dlq.index") {
		t.Fatalf("redrive of graph's dead letter as index's: %d, %v", n, err)
	}
	if deadlettertest.Msgs(t, fx.DLQ) != dlqBefore || fx.Gone(t, idx[2]) || len(w.requests) != 1 {
		t.Fatal("a refused redrive changed the dead letters")
	}
}

// An ingest dead letter is republished to its subject; a redrive that
// crashed after its republish and before the delete is dropped by the
// duplicate window when retried, and the dead letter deleted.
func TestRedriveRetriedRepublish(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	seq := fx.Seqs["ingest"][1]
	dl, err := fx.DLQ.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fx.JS.PublishMsg(ctx, deadletter.RedriveMsg(dl), jetstream.WithMsgID(deadletter.RedriveMsgID(seq, dl.Data))); err != nil {
		t.Fatal(err)
	}
	ingestBefore := deadlettertest.Msgs(t, fx.Ingest)
	var got []deadletter.Redriven
	if _, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "ingest", Seqs: []uint64{seq}}, func(r deadletter.Redriven) { got = append(got, r) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[0].Duplicate || got[0].Path != deadletter.Republish || got[0].Stream != writer.IngestStream {
		t.Fatalf("retried redrive: %+v, want a duplicate republish", got)
	}
	if got := deadlettertest.Msgs(t, fx.Ingest); got != ingestBefore {
		t.Fatalf("a retried redrive was stored twice: %d messages, want %d", got, ingestBefore)
	}
	back, err := fx.Ingest.GetLastMsgForSubject(ctx, contract.IngestSubject("in/2"))
	if err != nil {
		t.Fatal(err)
	}
	if back.Header.Get(contract.HeaderCommitTime) != deadlettertest.CommitTime || !strings.HasPrefix(back.Header.Get(nats.MsgIdHdr), fmt.Sprintf("redrive-%d-", seq)) {
		t.Fatalf("the original's headers are not kept: %v", back.Header)
	}
	for k := range back.Header {
		if strings.HasPrefix(k, "Converge-Dlq-") {
			t.Fatalf("redriven message carries %s: %v", k, back.Header)
		}
	}
	if !fx.Gone(t, seq) {
		t.Fatal("the retried redrive left its dead letter")
	}
}

func TestRedriveAll(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	if got := deadlettertest.Msgs(t, fx.Ingest); got != 0 {
		t.Fatalf("%s holds %d messages before the redrive", writer.IngestStream, got)
	}
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "ingest", All: true}, nil)
	if err != nil || n != 2 {
		t.Fatalf("redrive all: %d, %v", n, err)
	}
	for i, key := range []string{"in/1", "in/2"} {
		m, err := fx.Ingest.GetLastMsgForSubject(ctx, contract.IngestSubject(key))
		if err != nil {
			t.Fatalf("%s not back on its subject: %v", key, err)
		}
		seq := fx.Seqs["ingest"][i]
		if !bytes.Equal(m.Data, fx.Data[seq]) || m.Header.Get(nats.MsgIdHdr) != deadletter.RedriveMsgID(seq, fx.Data[seq]) {
			t.Fatalf("%s redriven as %q %v", key, m.Data, m.Header)
		}
		if !fx.Gone(t, seq) {
			t.Fatalf("dead letter #%d still there", seq)
		}
	}
	if got := deadlettertest.Msgs(t, fx.DLQ); got != 4 {
		t.Fatalf("%s holds %d dead letters, want the 4 of index and graph", deadletter.Stream, got)
	}
	var unknown *deadletter.UnknownConsumerError
	if _, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "ingest", All: true}, nil); !errors.As(err, &unknown) || unknown.Consumer != "ingest" {
		t.Fatalf("redrive of a consumer without dead letters: %v", err)
	}
}

func TestRedriveDryRunChangesNothing(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	dlqBefore, docsBefore := deadlettertest.Msgs(t, fx.DLQ), deadlettertest.Msgs(t, fx.Docs)
	var got []deadletter.Redriven
	// Without a writer: a dry run asks none.
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", All: true, DryRun: true}, func(r deadletter.Redriven) { got = append(got, r) })
	if err != nil || n != 2 || len(got) != 3 {
		t.Fatalf("dry run: %d, %v, %+v", n, err, got)
	}
	for i, r := range got {
		if r.Seq != fx.Seqs["index"][i] || r.Path != deadletter.Reemit || !strings.HasPrefix(r.Subject, contract.DocsSubjectPrefix) || r.Stream != contract.DocsStream || r.StreamSeq != 0 {
			t.Errorf("dry run %d: %+v", i, r)
		}
	}
	// docs/b's data is not JSON: it names no document to re-emit.
	if got[0].Key != "docs/a" || got[0].Payload.Key != "docs/a" || got[0].Kept != "" || got[1].Key != "" || !strings.Contains(got[1].Kept, "names no document key") ||
		got[2].Key != "docs/c" || got[2].Kept != "" {
		t.Errorf("dry run %+v", got)
	}
	if _, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "graph", Seqs: fx.Seqs["graph"], DryRun: true}, nil); err != nil {
		t.Fatal(err)
	}
	if deadlettertest.Msgs(t, fx.DLQ) != dlqBefore || deadlettertest.Msgs(t, fx.Docs) != docsBefore {
		t.Fatal("a dry run changed the streams")
	}
}

func TestRedriveSelection(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	for _, r := range []deadletter.Redrive{
		{Consumer: "index"},
		{Consumer: "index", All: true, Seqs: []uint64{1}},
		{Consumer: "index", Seqs: []uint64{999}},
		{Consumer: "nope", All: true},
	} {
		if n, err := q.Redrive(ctx, r, nil); err == nil || n != 0 {
			t.Errorf("redrive %+v: %d, %v; want an error", r, n, err)
		}
	}
	if got := deadlettertest.Msgs(t, fx.DLQ); got != 6 {
		t.Fatalf("refused redrives changed %s: %d dead letters", deadletter.Stream, got)
	}
}

// A dead letter without its original subject, or whose original stream no
// longer holds that subject, is not redriven: the redrive stops naming it,
// and the dead letter stays.
func TestRedriveRefusals(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	publish := func(h nats.Header) uint64 {
		t.Helper()
		m := nats.NewMsg(contract.DLQSubject("index"))
		m.Header = h
		m.Data = []byte(`{"not":"an event"}`)
		ack, err := fx.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	noSubject := publish(nats.Header{deadletter.HeaderStream: {contract.DocsStream}})
	elsewhere := publish(nats.Header{deadletter.HeaderSubject: {contract.Subject("doc/1")}, deadletter.HeaderStream: {"SOME_OTHER_STREAM"}})
	before := deadlettertest.Msgs(t, fx.DLQ)
	w := newFakeWriter(map[string]int64{"docs/a": 3})

	_, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{noSubject}, Writer: w}, nil)
	if err == nil || !strings.Contains(err.Error(), deadletter.HeaderSubject) || !strings.Contains(err.Error(), fmt.Sprintf("#%d", noSubject)) {
		t.Errorf("redrive without the subject header: %v; want an error naming the header and the dead letter", err)
	}
	_, err = q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{elsewhere}, Writer: w}, nil)
	if err == nil || !strings.Contains(err.Error(), "SOME_OTHER_STREAM") {
		t.Errorf("redrive into a stream that no longer holds the subject: %v; want an error naming it", err)
	}
	elsewhereSubject := publish(nats.Header{deadletter.HeaderSubject: {"converge.other.x"}})
	_, err = q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{elsewhereSubject}, Writer: w}, nil)
	if err == nil || !strings.Contains(err.Error(), "converge.other.x") || !strings.Contains(err.Error(), "neither") {
		t.Errorf("redrive of a subject of no known stream: %v; want an error naming it", err)
	}
	// With others before it, the count says how far the redrive got: the
	// document dead letter read before the refusal is re-emitted.
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{fx.Seqs["index"][0], noSubject}, Writer: w}, nil)
	if err == nil || n != 1 || fmt.Sprint(w.requests) != "[[docs/a]]" {
		t.Errorf("redrive stopped by a dead letter without a subject: %d, %v, %v; want 1 and an error", n, err, w.requests)
	}
	if got := deadlettertest.Msgs(t, fx.DLQ); got != before || fx.Gone(t, noSubject) || fx.Gone(t, elsewhere) || fx.Gone(t, elsewhereSubject) {
		t.Fatalf("refused redrives changed %s: %d dead letters, want %d", deadletter.Stream, got, before)
	}
}

func TestQueueWithoutStream(t *testing.T) {
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	q, err := deadletter.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := q.Summarize(ctx, 0)
	if err != nil || q.Exists() || sum.Exists || len(sum.Consumers) != 0 {
		t.Fatalf("summary without the stream: %+v, %v", sum, err)
	}
	if _, err := q.Read(ctx, "index", 0); err == nil || !strings.Contains(err.Error(), "no consumer has any") {
		t.Fatalf("read without the stream: %v", err)
	}
	if n, err := q.Count(ctx, "index"); n != 0 || err != nil {
		t.Fatalf("count without the stream: %d, %v", n, err)
	}
}
