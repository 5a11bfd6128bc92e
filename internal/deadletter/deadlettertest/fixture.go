// Package deadlettertest builds dead letters the way converge's consumers
// build them, on an embedded NATS server, for the tests of the dead-letter
// queue and of the commands that read it.
package deadlettertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// CommitTime is the commit-time header of every original message.
const CommitTime = "2026-01-02T03:04:05.123456789Z"

// Fixture is a NATS server with the streams of a pipeline and six dead
// letters of three consumers, in this order:
//
//	index  docs/a  an upserted event      store_rejected
//	graph  docs/a  the same event         graph_rejected
//	index  docs/b  data that is not JSON  invalid_json
//	ingest in/1    an ingest document     invalid_document
//	index  docs/c  a withdrawn event      store_rejected
//	ingest in/2    an ingest document     invalid_document
type Fixture struct {
	URL    string
	JS     jetstream.JetStream
	DLQ    jetstream.Stream
	Docs   jetstream.Stream
	Ingest jetstream.Stream
	// Seqs are the CONVERGE_DLQ sequences of each consumer, in order.
	Seqs map[string][]uint64
	// Data is the original data of each dead letter, by CONVERGE_DLQ
	// sequence.
	Data map[uint64][]byte
}

// New starts the server and stores the dead letters.
func New(t testing.TB) *Fixture {
	t.Helper()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	fx := &Fixture{URL: n.URL, JS: js, Seqs: map[string][]uint64{}, Data: map[uint64][]byte{}}
	if fx.Docs, err = relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := writer.NewIngest(js, nil, writer.IngestConfig{}, nil, nil).EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if fx.Ingest, err = js.Stream(ctx, writer.IngestStream); err != nil {
		t.Fatal(err)
	}
	if err := deadletter.EnsureStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if fx.DLQ, err = js.Stream(ctx, deadletter.Stream); err != nil {
		t.Fatal(err)
	}

	upserted := encodeEvent(t, contract.NewUpsertedEvent(contract.Document{Key: "docs/a", Version: 3, Title: "A", Body: "alpha"}, []string{"alpha"}))
	withdrawn := encodeEvent(t, contract.NewWithdrawnEvent("docs/c", 2))
	garbage := []byte("\x00\xffnot json")
	fx.DeadLetter(t, "index", contract.Subject("docs/a"), upserted, "store_rejected")
	fx.DeadLetter(t, "graph", contract.Subject("docs/a"), upserted, "graph_rejected")
	fx.DeadLetter(t, "index", contract.Subject("docs/b"), garbage, "invalid_json")
	fx.DeadLetter(t, "ingest", contract.IngestSubject("in/1"), []byte(`{"key":"in/1","version":1,"body":"one"}`), "invalid_document")
	fx.DeadLetter(t, "index", contract.Subject("docs/c"), withdrawn, "store_rejected")
	fx.DeadLetter(t, "ingest", contract.IngestSubject("in/2"), []byte(`{"key":"in/2","version":7,"body":"two"}`), "invalid_document")
	return fx
}

func encodeEvent(t testing.TB, ev contract.Event) []byte {
	t.Helper()
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// DeadLetter publishes data on subject as its producer would, receives it
// as consumer, and dead-letters it with code as the consumer does.
func (fx *Fixture) DeadLetter(t testing.TB, consumer, subject string, data []byte, code string) {
	t.Helper()
	ctx := context.Background()
	stream := writer.IngestStream
	switch {
	case strings.HasPrefix(subject, contract.DocsSubjectPrefix):
		stream = contract.DocsStream
	case strings.HasPrefix(subject, contract.PartsSubjectPrefix):
		// A partition's message: the partitioned stream, here a plain
		// stream of its subjects (the server's sourcing is the relay's
		// tests' business).
		stream = contract.PartsStream
		if _, err := fx.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{contract.PartsSubjectPrefix + ">"}}); err != nil {
			t.Fatal(err)
		}
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, CommitTime)
	m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("original-%s-%d", subject, len(fx.Data)))
	ack, err := fx.JS.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy}
	if stream != writer.IngestStream { // a work queue delivers from the start only
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, ack.Sequence
	}
	cons, err := fx.JS.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	dlAck, err := fx.JS.PublishMsg(ctx, deadletter.New(consumer, got, code, fmt.Errorf("%s: cannot process %s", code, subject)))
	if err != nil {
		t.Fatal(err)
	}
	if err := got.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fx.JS.DeleteConsumer(ctx, stream, cons.CachedInfo().Name); err != nil {
		t.Fatal(err)
	}
	fx.Seqs[consumer] = append(fx.Seqs[consumer], dlAck.Sequence)
	fx.Data[dlAck.Sequence] = data
}

// Msgs returns the number of messages in s.
func Msgs(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Gone reports whether the dead letter at seq was deleted.
func (fx *Fixture) Gone(t testing.TB, seq uint64) bool {
	t.Helper()
	_, err := fx.DLQ.GetMsg(context.Background(), seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}
	return err != nil
}
