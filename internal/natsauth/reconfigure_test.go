package natsauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
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

// The streams and buckets of a deployment, and who may create, update,
// purge or delete each: a service creates what it needs when it is absent;
// the one that owns a stream or bucket whole (the writer its queue, the
// relay its positions, the notifier its effect records) also updates it;
// the operator (converge streams apply) alone updates what others rely on;
// nobody purges or deletes.
var streamRights = map[string]map[string][]string{
	contract.DocsStream:     {"CREATE": {natsauth.UserRelay, natsauth.UserOperator}, "UPDATE": {natsauth.UserOperator}},
	contract.EventsStream:   {"CREATE": {natsauth.UserRelay, natsauth.UserOperator}, "UPDATE": {natsauth.UserOperator}},
	contract.RemovalsStream: {"CREATE": {natsauth.UserRelay, natsauth.UserOperator}, "UPDATE": {natsauth.UserOperator}},
	natsauth.IngestStream:   {"CREATE": {natsauth.UserWriter}, "UPDATE": {natsauth.UserWriter}},
	deadletter.Stream: {"CREATE": {natsauth.UserWriter, natsauth.UserIndex, natsauth.UserGraph, natsauth.UserNotifier, natsauth.UserOperator},
		"UPDATE": {natsauth.UserOperator}},
	"KV_" + lease.Bucket: {"CREATE": {natsauth.UserIndex, natsauth.UserGraph, natsauth.UserNotifier, natsauth.UserOperator},
		"UPDATE": {natsauth.UserOperator}},
	"KV_" + rebuild.Bucket:          {"CREATE": {natsauth.UserIndex, natsauth.UserGraph, natsauth.UserOperator}, "UPDATE": {natsauth.UserOperator}},
	"KV_" + relay.PositionBucket:    {"CREATE": {natsauth.UserRelay}, "UPDATE": {natsauth.UserRelay}},
	"KV_" + natsauth.NotifierBucket: {"CREATE": {natsauth.UserNotifier}, "UPDATE": {natsauth.UserNotifier}},
}

var streamVerbs = []string{"CREATE", "UPDATE", "PURGE", "DELETE"}

// The grants say what streamRights says, no more.
func TestStreamRightsAreTheGrants(t *testing.T) {
	perms := natsauth.Permissions()
	for _, user := range slices.Sorted(maps.Keys(perms)) {
		for stream, rights := range streamRights {
			for _, verb := range streamVerbs {
				subject := "$JS.API.STREAM." + verb + "." + stream
				granted := slices.ContainsFunc(perms[user].Publish.Allow, func(g string) bool { return matchSubject(g, subject) })
				if want := slices.Contains(rights[verb], user); granted != want {
					t.Errorf("%s may publish %s: %v, want %v", user, subject, granted, want)
				}
			}
		}
	}
}

// Every user asks the real server to shrink every stream and bucket it may
// not update (MaxMsgsPerSubject 1, MaxAge 1s: a purge by another name),
// and to create, purge and delete what it may not: each request is
// refused, and every stream keeps its settings and its messages.
func TestNobodyReconfiguresWhatItDoesNotOwn(t *testing.T) {
	e := newEnv(t)
	bg := context.Background()
	// The deployment, as its services and the operator make it, one
	// message in each stream.
	a := e.docsAsAdmin()
	if _, err := relay.EnsureEffectsStream(bg, a.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	if err := writer.NewIngest(a.js, nil, writer.IngestConfig{}, nil, nil).EnsureStreams(bg); err != nil {
		t.Fatal(err)
	}
	for _, b := range []sharedkv.Config{lease.BucketConfig(1), rebuild.BucketConfig(1)} {
		if _, _, err := sharedkv.Open(bg, a.js, b); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{relay.PositionBucket, natsauth.NotifierBucket} {
		if _, err := a.js.CreateKeyValue(bg, jetstream.KeyValueConfig{Bucket: b}); err != nil {
			t.Fatal(err)
		}
	}
	publishEvent(t, a.js, upsert(t, "doc-1", 1))
	publishEventTo(t, a.js, contract.EventsSubject, upsert(t, "doc-1", 1))
	for _, subject := range []string{contract.IngestSubject("doc-1"), contract.DLQSubject("index"), contract.RemovalsSubject(contract.EventsStream, "notifier"),
		"$KV." + lease.Bucket + ".index", "$KV." + rebuild.Bucket + ".index", "$KV." + relay.PositionBucket + ".slot", "$KV." + natsauth.NotifierBucket + ".effect"} {
		if _, err := a.js.Publish(bg, subject, []byte(`{"key":"doc-1","version":1}`)); err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
	}
	before := map[string]*jetstream.StreamInfo{}
	for stream := range streamRights {
		s, err := a.js.Stream(bg, stream)
		if err != nil {
			t.Fatal(err)
		}
		before[stream] = s.CachedInfo()
	}

	for _, user := range slices.Sorted(maps.Keys(natsauth.Permissions())) {
		c := e.connect(user)
		for _, stream := range slices.Sorted(maps.Keys(streamRights)) {
			shrunk := before[stream].Config
			shrunk.MaxMsgsPerSubject, shrunk.MaxAge = 1, time.Second
			body, err := json.Marshal(shrunk)
			if err != nil {
				t.Fatal(err)
			}
			for _, verb := range streamVerbs {
				if slices.Contains(streamRights[stream][verb], user) {
					continue
				}
				subject := "$JS.API.STREAM." + verb + "." + stream
				if err := c.nc.PublishRequest(subject, c.nc.NewRespInbox(), body); err != nil {
					t.Fatal(err)
				}
				c.refused(t, "Publish to", subject)
			}
		}
	}
	for stream, was := range before {
		s, err := a.js.Stream(bg, stream)
		if err != nil {
			t.Fatalf("stream %s after the attempts: %v", stream, err)
		}
		now := s.CachedInfo()
		if now.Config.MaxMsgsPerSubject != was.Config.MaxMsgsPerSubject || now.Config.MaxAge != was.Config.MaxAge ||
			now.State.Msgs != was.State.Msgs || now.State.Msgs == 0 {
			t.Errorf("stream %s: max per subject %d, max age %v, %d messages; before %d, %v, %d",
				stream, now.Config.MaxMsgsPerSubject, now.Config.MaxAge, now.State.Msgs,
				was.Config.MaxMsgsPerSubject, was.Config.MaxAge, was.State.Msgs)
		}
	}
}

// The relay creates its streams and never changes them: one made with
// other settings (here by the operator) stays as it is, and the relay's
// error names each setting that differs and the command that changes it.
func TestRelayNeverChangesItsStreams(t *testing.T) {
	e := newEnv(t)
	o := e.connect(natsauth.UserOperator)
	r := e.connect(natsauth.UserRelay)
	if _, err := relay.EnsureStream(ctx(t), r.js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ApplyStream(ctx(t), o.js, relay.StreamConfig{MaxMsgsPerSubject: 2, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_, err := relay.EnsureStream(ctx(t), r.js, relay.StreamConfig{})
	var se *relay.StreamSettingsError
	if !errors.As(err, &se) || se.Stream != contract.DocsStream || len(se.Differences) != 2 ||
		!strings.Contains(err.Error(), "MaxMsgsPerSubject 2, configured 4") || !strings.Contains(err.Error(), "MaxAge 1h0m0s, configured 0s") ||
		!strings.Contains(err.Error(), "converge streams apply") {
		t.Fatalf("the relay ensuring a stream with other settings: %v", err)
	}
	if _, err := r.js.UpdateStream(ctx(t), jetstream.StreamConfig{Name: contract.DocsStream,
		Subjects: []string{contract.DocsSubjectPrefix + ">"}, MaxMsgsPerSubject: 1}); err == nil {
		t.Fatal("the relay updated the documents' stream")
	}
	r.refused(t, "Publish to", "$JS.API.STREAM.UPDATE."+contract.DocsStream)
	s, err := o.js.Stream(ctx(t), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxMsgsPerSubject != 2 || c.MaxAge != time.Hour {
		t.Errorf("the documents' stream keeps %d per subject for %v, want 2 for 1h", c.MaxMsgsPerSubject, c.MaxAge)
	}
}
