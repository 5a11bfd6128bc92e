package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// Each test below connects as one service's user to the real server and
// does what that service must never do; the server refuses, and the
// service's handler logs and counts the refusal.

// The relay alone publishes document events: a projector's publish to
// converge.docs.> is refused, and so is its subscription to them.
func TestProjectorCannotPublishDocuments(t *testing.T) {
	e := newEnv(t)
	e.docsAsAdmin()
	p := e.connect(natsauth.UserIndex)
	if err := p.nc.Publish("converge.docs.x", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", "converge.docs.x")
	if _, err := p.js.Publish(ctx(t), "converge.docs.y", []byte("forged")); err == nil {
		t.Fatal("a JetStream publish to converge.docs.y was acknowledged")
	}
	p.refused(t, "Publish to", "converge.docs.y")
	if _, err := p.nc.SubscribeSync("converge.docs.>"); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Subscription to", "converge.docs.>")
}

// A projector consumes its own consumer only: it can neither create,
// read, pull from nor delete another projector's.
func TestProjectorCannotUseAnotherProjectorsConsumer(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := a.js.CreateOrUpdateConsumer(context.Background(), contract.DocsStream, jetstream.ConsumerConfig{
		Durable: "graph", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.UserIndex)

	_, err := p.js.CreateOrUpdateConsumer(ctx(t), contract.DocsStream, jetstream.ConsumerConfig{
		Durable: "graph", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"})
	if err == nil {
		t.Fatal("the index projector created the graph projector's consumer")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.CREATE.CONVERGE_DOCS.graph.converge.docs.>")

	if _, err := p.js.Consumer(ctx(t), contract.DocsStream, "graph"); err == nil {
		t.Fatal("the index projector read the graph projector's consumer")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.INFO.CONVERGE_DOCS.graph")

	if err := p.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.CONVERGE_DOCS.graph", p.nc.NewRespInbox(), []byte(`{"batch":1}`)); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.MSG.NEXT.CONVERGE_DOCS.graph")

	if err := p.js.DeleteConsumer(ctx(t), contract.DocsStream, "graph"); err == nil {
		t.Fatal("the index projector deleted the graph projector's consumer")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.DELETE.CONVERGE_DOCS.graph")

	// Its own consumer's subject with another name in the request: the
	// server checks that the two agree.
	resp, err := p.nc.Request("$JS.API.CONSUMER.CREATE.CONVERGE_DOCS.index.converge.docs.>",
		[]byte(`{"stream_name":"CONVERGE_DOCS","config":{"durable_name":"graph","name":"graph","ack_policy":"explicit","filter_subject":"converge.docs.>","description":"forged"}}`), 2e9)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(resp.Data), "consumer name in subject does not match durable name in request") {
		t.Errorf("a create request naming graph under index's subject: %s", resp.Data)
	}
	if _, err := a.js.Consumer(context.Background(), contract.DocsStream, "index"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("a create request naming graph under index's subject created index: %v", err)
	}
	info, err := a.js.Consumer(context.Background(), contract.DocsStream, "graph")
	if err != nil {
		t.Fatal(err)
	}
	if info.CachedInfo().Config.AckPolicy != jetstream.AckExplicitPolicy || info.CachedInfo().Config.Description != "" {
		t.Errorf("the graph consumer was changed: %+v", info.CachedInfo().Config)
	}
}

// A projector reads neither the notifier's bucket nor another
// projector's key in the rebuilds' bucket.
func TestProjectorCannotReadAnotherBucket(t *testing.T) {
	e := newEnv(t)
	a := e.connect(admin)
	bg := context.Background()
	effects, err := a.js.CreateKeyValue(bg, jetstream.KeyValueConfig{Bucket: natsauth.NotifierBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Put(bg, "effect", []byte("sent")); err != nil {
		t.Fatal(err)
	}
	rebuilds, err := a.js.CreateKeyValue(bg, jetstream.KeyValueConfig{Bucket: natsauth.RebuildBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rebuilds.Put(bg, "graph", []byte(`{"id":"r1"}`)); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.UserIndex)

	if _, err := p.js.KeyValue(ctx(t), natsauth.NotifierBucket); err == nil {
		t.Fatal("the index projector opened the notifier's bucket")
	}
	p.refused(t, "Publish to", "$JS.API.STREAM.INFO.KV_CONVERGE_EFFECTS")
	if err := p.nc.PublishRequest("$JS.API.DIRECT.GET.KV_CONVERGE_EFFECTS.$KV.CONVERGE_EFFECTS.effect", p.nc.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", "$JS.API.DIRECT.GET.KV_CONVERGE_EFFECTS.$KV.CONVERGE_EFFECTS.effect")

	// Its own bucket, opened as a rebuild opens it: its key only.
	kv, _, err := sharedkv.Open(ctx(t), p.js, rebuild.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx(t), "graph"); err == nil {
		t.Fatal("the index projector read the graph projector's rebuild state")
	}
	p.refused(t, "Publish to", "$JS.API.DIRECT.GET.KV_CONVERGE_REBUILDS.$KV.CONVERGE_REBUILDS.graph")
	if _, err := kv.Put(ctx(t), "graph", []byte("{}")); err == nil {
		t.Fatal("the index projector wrote the graph projector's rebuild state")
	}
	p.refused(t, "Publish to", "$KV.CONVERGE_REBUILDS.graph")
	if e, err := rebuilds.Get(bg, "graph"); err != nil || string(e.Value()) != `{"id":"r1"}` {
		t.Errorf("graph's rebuild state is %v, %v", e, err)
	}
}

// The relay ensures and publishes to the stream; it cannot delete or
// purge it, nor delete a consumer.
func TestRelayCannotDelete(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	if _, err := a.js.CreateOrUpdateConsumer(context.Background(), contract.DocsStream, jetstream.ConsumerConfig{
		Durable: "index", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	r := e.connect(natsauth.UserRelay)

	if err := r.js.DeleteStream(ctx(t), contract.DocsStream); err == nil {
		t.Fatal("the relay deleted the stream")
	}
	r.refused(t, "Publish to", "$JS.API.STREAM.DELETE.CONVERGE_DOCS")
	s, err := a.js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.nc.PublishRequest("$JS.API.STREAM.PURGE.CONVERGE_DOCS", r.nc.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	r.refused(t, "Publish to", "$JS.API.STREAM.PURGE.CONVERGE_DOCS")
	if err := r.js.DeleteConsumer(ctx(t), contract.DocsStream, "index"); err == nil {
		t.Fatal("the relay deleted a consumer")
	}
	r.refused(t, "Publish to", "$JS.API.CONSUMER.DELETE.CONVERGE_DOCS.index")
	if _, err := s.Consumer(context.Background(), "index"); err != nil {
		t.Errorf("the index consumer: %v", err)
	}
}

// The writer's output is Postgres and its dead letters: it cannot publish
// document events.
func TestWriterCannotPublishDocuments(t *testing.T) {
	e := newEnv(t)
	e.docsAsAdmin()
	w := e.connect(natsauth.UserWriter)
	if err := w.nc.Publish("converge.docs.x", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	w.refused(t, "Publish to", "converge.docs.x")
}

// The operator cannot publish document events; its redrive of a
// projector's dead letter goes through the writer instead: the writer
// re-emits the document into the outbox and the relay, as its own user,
// publishes it. Here the writer's real API and client run over a store
// whose outbox is relayed at once.
func TestOperatorCannotPublishDocuments(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin()
	o := e.connect(natsauth.UserOperator)
	if err := o.nc.Publish("converge.docs.x", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	o.refused(t, "Publish to", "converge.docs.x")

	ev := upsert(t, "doc-1", 1)
	publishEvent(t, a.js, ev)
	deadLetter(t, a, "index", "index", contract.DocsStream)
	store := &relayedStore{t: t, relay: e.connect(natsauth.UserRelay), docs: map[string]contract.Event{ev.Key: ev}}
	srv := httptest.NewServer(writer.NewAPI(store, writer.APIConfig{}, nil, nil))
	t.Cleanup(srv.Close)
	wc, err := writer.NewClient(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	q, err := deadletter.Open(context.Background(), o.js)
	if err != nil {
		t.Fatal(err)
	}
	var got []deadletter.Redriven
	n, err := q.Redrive(ctx(t), deadletter.Redrive{Consumer: "index", All: true, Writer: writerReemitter{wc}}, func(r deadletter.Redriven) { got = append(got, r) })
	if err != nil || n != 1 || len(got) != 1 || got[0].Path != deadletter.Reemit || got[0].Key != ev.Key || got[0].Emission != 1 {
		t.Fatalf("redrive of a projector's dead letter through the writer: %d, %v, %+v", n, err, got)
	}
	if c, err := q.Count(context.Background(), "index"); err != nil || c != 0 {
		t.Errorf("dead letters of index after the redrive: %d, %v", c, err)
	}
	// The re-emission is in the stream, published by the relay.
	docs, err := a.js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := docs.GetLastMsgForSubject(context.Background(), contract.Subject(ev.Key))
	if err != nil || m.Sequence != 2 || m.Header.Get(contract.HeaderReemission) != "1" {
		t.Fatalf("the re-emission in %s: %+v, %v", contract.DocsStream, m, err)
	}
	store.relay.allowed(t)
	// The operator published nothing to the stream: its one attempt,
	// above, is its only refusal.
	o.settle(t)
	if errs := o.errors(); len(errs) != 1 {
		t.Errorf("the operator's refusals: %q, want only converge.docs.x", errs)
	}
	if err := o.nc.Publish(contract.Subject(ev.Key), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	o.refused(t, "Publish to", contract.Subject(ev.Key))
}

// relayedStore is the writer's store for re-emissions: its outbox is
// relayed as soon as written, by the relay's user, with the re-emission
// header the relay sets.
type relayedStore struct {
	writer.Store // the routes a redrive does not call
	t            *testing.T
	relay        *client
	docs         map[string]contract.Event
	emission     int64
}

func (s *relayedStore) Reemit(ctx context.Context, keys []string) (docstore.Reemitted, error) {
	var out docstore.Reemitted
	for _, k := range keys {
		ev, ok := s.docs[k]
		if !ok {
			out.NotFound = append(out.NotFound, k)
			continue
		}
		data, err := ev.Encode()
		if err != nil {
			return docstore.Reemitted{}, err
		}
		s.emission++
		m := nats.NewMsg(contract.Subject(k))
		m.Data = data
		m.Header.Set(contract.HeaderReemission, strconv.FormatInt(s.emission, 10))
		if _, err := s.relay.js.PublishMsg(ctx, m, jetstream.WithMsgID(fmt.Sprintf("%s.%d", ev.ID, s.emission))); err != nil {
			return docstore.Reemitted{}, err
		}
		out.Reemitted = append(out.Reemitted, docstore.Reemission{Key: k, Version: ev.Version, EventID: ev.ID, Emission: s.emission})
	}
	return out, nil
}

// writerReemitter is the writer's client as a deadletter.Reemitter, as
// converge dlq adapts it.
type writerReemitter struct{ c *writer.Client }

func (w writerReemitter) ReemitKeys(ctx context.Context, keys []string) (deadletter.Reemission, error) {
	res, err := w.c.ReemitKeys(ctx, keys)
	out := deadletter.Reemission{NotFound: res.NotFound}
	for _, d := range res.Reemitted {
		out.Reemitted = append(out.Reemitted, deadletter.ReemittedKey{Key: d.Key, Version: d.Version, EventID: d.EventID, Emission: d.Emission})
	}
	return out, err
}

// A producer may only publish documents to the writer's queue.
func TestProducerOnlyPublishesToIngest(t *testing.T) {
	e := newEnv(t)
	p := e.connect(natsauth.UserProducer)
	for _, subject := range []string{"converge.docs.x", "converge.dlq.index", "$JS.API.STREAM.DELETE.CONVERGE_INGEST"} {
		if err := p.nc.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
		p.refused(t, "Publish to", subject)
	}
}

// deadLetter fetches the first message of stream with the durable
// consumer durable (made by a) and dead-letters it to converge.dlq.<name>,
// as the consumers do.
func deadLetter(t *testing.T, a *client, durable, name, stream string) {
	t.Helper()
	bg := context.Background()
	if err := deadletter.EnsureStream(bg, a.js, 1); err != nil {
		t.Fatal(err)
	}
	c, err := a.js.CreateOrUpdateConsumer(bg, stream, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := deadletter.Publish(bg, a.js, name, m, "test", errors.New("cannot apply"), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
}

// The dead letters' stream and the rebuilds' bucket are shared: a
// projector may create them, never change their configuration (a shorter
// retention would drop the others' dead letters or rebuild state).
func TestProjectorCannotReconfigureSharedStreams(t *testing.T) {
	e := newEnv(t)
	a := e.connect(admin)
	if err := deadletter.EnsureStream(context.Background(), a.js, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: natsauth.RebuildBucket, History: 1}); err != nil {
		t.Fatal(err)
	}
	p := e.connect(natsauth.UserIndex)
	// Ensuring what exists is allowed, and changes nothing.
	if err := deadletter.EnsureStream(context.Background(), p.js, 1); err != nil {
		t.Fatalf("a projector ensuring the dead letters' stream: %v", err)
	}
	if _, err := p.js.UpdateStream(ctx(t), jetstream.StreamConfig{Name: deadletter.Stream,
		Subjects: []string{contract.DLQSubjectPrefix + ">"}, MaxMsgs: 1}); err == nil {
		t.Fatal("a projector shrank the dead letters' stream")
	}
	p.refused(t, "Publish to", "$JS.API.STREAM.UPDATE."+deadletter.Stream)
	sc := sharedkv.StreamConfig(rebuild.BucketConfig(1))
	sc.MaxBytes = 1
	if _, err := p.js.UpdateStream(ctx(t), sc); err == nil {
		t.Fatal("a projector reconfigured the rebuilds' bucket")
	}
	p.refused(t, "Publish to", "$JS.API.STREAM.UPDATE.KV_"+natsauth.RebuildBucket)
	s, err := a.js.Stream(context.Background(), deadletter.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().Config.MaxMsgs != -1 {
		t.Errorf("the dead letters' stream now keeps at most %d messages", s.CachedInfo().Config.MaxMsgs)
	}
}

// A projector holds its own lease and resets its own consumer (and its
// rebuild's), and can do neither for another projector: it cannot take
// over the graph's store.
func TestProjectorHoldsOnlyItsOwnLease(t *testing.T) {
	e := newEnv(t)
	a := e.connect(admin)
	bg := context.Background()
	if _, err := a.js.CreateOrUpdateStream(bg, jetstream.StreamConfig{Name: contract.DocsStream, Subjects: []string{contract.DocsSubjectPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"index", "graph", rebuild.ConsumerName("index"), rebuild.ConsumerName("graph")} {
		if _, err := a.js.CreateOrUpdateConsumer(bg, contract.DocsStream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	p := e.connect(natsauth.UserIndex)
	if _, err := p.js.ResetConsumer(ctx(t), contract.DocsStream, rebuild.ConsumerName("index")); err != nil {
		t.Fatalf("the index projector cannot reset its own rebuild's consumer: %v", err)
	}
	if _, err := p.js.ResetConsumer(ctx(t), contract.DocsStream, rebuild.ConsumerName("graph")); err == nil {
		t.Fatal("the index projector reset the graph's rebuild's consumer")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.RESET."+contract.DocsStream+"."+rebuild.ConsumerName("graph"))
	own, err := lease.Open(ctx(t), p.js, lease.Config{Name: "index", TTL: time.Second}, nil)
	if err != nil {
		t.Fatalf("the index projector cannot open its lease: %v", err)
	}
	term, err := own.Acquire(ctx(t), nil)
	if err != nil {
		t.Fatalf("the index projector cannot take its lease: %v", err)
	}
	defer term.Release()
	if _, err := p.js.ResetConsumer(ctx(t), contract.DocsStream, "index"); err != nil {
		t.Fatalf("the index projector cannot reset its own consumer: %v", err)
	}

	other, err := lease.Open(ctx(t), p.js, lease.Config{Name: "graph", TTL: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(bg, 2*time.Second)
	defer cancel()
	if _, err := other.Acquire(short, nil); err == nil {
		t.Fatal("the index projector took the graph projector's lease")
	}
	p.refused(t, "Publish to", "$JS.API.DIRECT.GET.KV_CONVERGE_LEASES.$KV.CONVERGE_LEASES.graph")
	if err := p.nc.Publish("$KV.CONVERGE_LEASES.graph", []byte(`{"holder":"index"}`)); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", "$KV.CONVERGE_LEASES.graph")
	if _, err := p.js.ResetConsumer(ctx(t), contract.DocsStream, "graph"); err == nil {
		t.Fatal("the index projector reset the graph projector's consumer")
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.RESET."+contract.DocsStream+".graph")
	if err := p.nc.PublishRequest("$JS.API.CONSUMER.UNPIN."+contract.DocsStream+".graph", p.nc.NewRespInbox(), []byte(`{"group":"writer"}`)); err != nil {
		t.Fatal(err)
	}
	p.refused(t, "Publish to", "$JS.API.CONSUMER.UNPIN."+contract.DocsStream+".graph")
}
