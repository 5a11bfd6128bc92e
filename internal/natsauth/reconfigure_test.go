package natsauth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/sharedkv"
)

// The tests below are each a user that holds one key of a shared bucket,
// or publishes to a stream it does not own, trying to change what the
// others rely on: the server refuses, and nothing changes.

// A roll-up on one's own key of a shared bucket would purge every other
// key (Nats-Rollup: all), and the grant of one key is enough to send it:
// the buckets the services create refuse roll-ups.
func TestNoUserRollsUpASharedBucket(t *testing.T) {
	e := newEnv(t)
	bg := context.Background()
	graph := e.connect(natsauth.UserGraph)
	// The graph projector comes first and creates both buckets, as it
	// does at its start.
	l, err := lease.Open(ctx(t), graph.js, lease.Config{Name: "graph", TTL: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	term, err := l.Acquire(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Release()
	rebuilds, _, err := sharedkv.Open(ctx(t), graph.js, rebuild.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rebuilds.Put(bg, "graph", []byte(`{"id":"r1"}`)); err != nil {
		t.Fatal(err)
	}

	index := e.connect(natsauth.UserIndex)
	for _, bucket := range []string{lease.Bucket, rebuild.Bucket} {
		for _, rollup := range []string{jetstream.MsgRollupAll, jetstream.MsgRollupSubject} {
			m := nats.NewMsg("$KV." + bucket + ".index")
			m.Header.Set(jetstream.MsgRollup, rollup)
			m.Data = []byte("{}")
			if _, err := index.js.PublishMsg(ctx(t), m); err == nil {
				t.Errorf("the index projector rolled up %s (%s)", bucket, rollup)
			}
		}
	}
	if err := index.nc.PublishRequest("$JS.API.STREAM.PURGE.KV_"+lease.Bucket, index.nc.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	index.refused(t, "Publish to", "$JS.API.STREAM.PURGE.KV_"+lease.Bucket)

	if v, _, ok, err := l.Current(bg); err != nil || !ok || v.Holder == "" {
		t.Errorf("the graph projector's lease after the roll-ups: %+v, %v, %v", v, ok, err)
	}
	if e, err := rebuilds.Get(bg, "graph"); err != nil || string(e.Value()) != `{"id":"r1"}` {
		t.Errorf("the graph projector's rebuild state after the roll-ups: %v, %v", e, err)
	}
}
