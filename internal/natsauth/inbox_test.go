package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/pkg/contract"
)

// A user's connection makes its inboxes where its permission set lets it
// subscribe, and nowhere another user may.
func TestEachUserSubscribesToItsOwnInboxes(t *testing.T) {
	perms := natsauth.Permissions()
	for user, p := range perms {
		opts, err := natsauth.ClientConfig{User: user, Password: "pw"}.Options()
		if err != nil {
			t.Fatal(err)
		}
		o := nats.GetDefaultOptions()
		for _, opt := range opts {
			if err := opt(&o); err != nil {
				t.Fatal(err)
			}
		}
		if o.InboxPrefix != natsauth.InboxPrefix(user) {
			t.Errorf("%s: inbox prefix %q, want %q", user, o.InboxPrefix, natsauth.InboxPrefix(user))
		}
		inbox := o.InboxPrefix + ".reply"
		if got := p.Subscribe.Allow; len(got) != 1 || !matchSubject(got[0], inbox) {
			t.Errorf("%s may subscribe to %q, want its own inboxes alone (%s)", user, got, inbox)
		}
		if matchSubject(p.Subscribe.Allow[0], nats.InboxPrefix+"reply") {
			t.Errorf("%s may subscribe to nats.go's default inboxes", user)
		}
		for other, q := range perms {
			if other != user && slices.ContainsFunc(q.Subscribe.Allow, func(g string) bool { return matchSubject(g, inbox) }) {
				t.Errorf("%s may subscribe to %s's inboxes (%q)", other, user, q.Subscribe.Allow)
			}
		}
	}
}

// Replies, pull deliveries, key-value answers and the acknowledgements of
// publishes go to the inboxes of the user that asked, and nobody else
// reads them. Every user in turn subscribes to _INBOX.> and to every other
// user's inboxes while the others fetch from their consumers, read their
// keys and publish: each subscription is refused and nothing arrives,
// though the others' answers did go to their inboxes.
func TestNobodyReadsAnothersReplies(t *testing.T) {
	e := newEnv(t)
	a := e.docsAsAdmin("a")
	bg := context.Background()
	if _, err := a.js.CreateOrUpdateConsumer(bg, contract.DocsStream, jetstream.ConsumerConfig{
		Durable: "index", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: contract.DocsSubjectPrefix + ">"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.js.CreateStream(bg, jetstream.StreamConfig{Name: natsauth.IngestStream,
		Subjects: []string{contract.IngestSubjectPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	for bucket, key := range map[string]string{lease.Bucket: "index", natsauth.NotifierBucket: "effect"} {
		kv, err := a.js.CreateKeyValue(bg, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(bg, key, []byte("secret of "+key)); err != nil {
			t.Fatal(err)
		}
	}

	// Where the answers went, as the server delivered them.
	delivered := make(chan *nats.Msg, 1024)
	if _, err := a.nc.ChanSubscribe(">", delivered); err != nil {
		t.Fatal(err)
	}

	// The eavesdroppers. A channel subscription takes each message as
	// the connection reads it, so after a round trip (Flush) the channel
	// holds all that the server sent before.
	users := slices.Sorted(maps.Keys(natsauth.Permissions()))
	type spy struct {
		c        *client
		subjects []string
		got      chan *nats.Msg
	}
	var spies []*spy
	for _, u := range users {
		s := &spy{c: e.connect(u), subjects: []string{"_INBOX.>"}, got: make(chan *nats.Msg, 1024)}
		for _, v := range users {
			if v != u {
				s.subjects = append(s.subjects, natsauth.InboxPrefix(v)+".>")
			}
		}
		for _, subject := range s.subjects {
			if _, err := s.c.nc.ChanSubscribe(subject, s.got); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		spies = append(spies, s)
	}

	// The others at work, each as its own user, in pipeline order (the
	// index fetches what the relay publishes).
	work := []struct {
		user string
		do   func(c *client) error
	}{
		{natsauth.UserRelay, func(c *client) error {
			publishEvent(t, c.js, upsert(t, "b", 1))
			return nil
		}},
		{natsauth.UserProducer, func(c *client) error {
			_, err := c.js.Publish(ctx(t), contract.IngestSubject("c"), []byte(`{"key":"c","version":1,"body":"c"}`))
			return err
		}},
		{natsauth.UserWriter, func(c *client) error {
			cons, err := c.js.CreateOrUpdateConsumer(ctx(t), natsauth.IngestStream, jetstream.ConsumerConfig{
				Durable: natsauth.IngestConsumer, AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				return err
			}
			return fetch(cons, 1)
		}},
		{natsauth.UserIndex, func(c *client) error {
			cons, err := c.js.Consumer(ctx(t), contract.DocsStream, "index")
			if err != nil {
				return err
			}
			if err := fetch(cons, 2); err != nil {
				return err
			}
			return get(c.js, lease.Bucket, "index")
		}},
		{natsauth.UserGraph, func(c *client) error {
			// Not held yet: the answer is that there is no such key.
			if err := get(c.js, lease.Bucket, "graph"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("the graph's lease: %w, want %w", err, jetstream.ErrKeyNotFound)
			}
			return nil
		}},
		{natsauth.UserNotifier, func(c *client) error {
			// Its bucket is its own: it opens it by ensuring it.
			kv, err := c.js.CreateOrUpdateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: natsauth.NotifierBucket})
			if err != nil {
				return err
			}
			_, err = kv.Get(ctx(t), "effect")
			return err
		}},
		{natsauth.UserOperator, func(c *client) error {
			_, err := c.js.Stream(ctx(t), contract.DocsStream)
			return err
		}},
	}
	if len(work) != len(users) {
		t.Fatalf("%d users at work, want every one of %q", len(work), users)
	}
	for _, w := range work {
		c := e.connect(w.user)
		if err := w.do(c); err != nil {
			t.Fatalf("%s at work: %v", w.user, err)
		}
		c.allowed(t)
	}

	for _, s := range spies {
		if err := s.c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n := len(s.got); n > 0 {
			var read []string
			for range n {
				m := <-s.got
				read = append(read, m.Subject+" (reply "+m.Reply+")")
			}
			t.Errorf("%s read %d messages of others' inboxes: %q", s.c.user, n, read)
		}
	}

	// The answers did go to inboxes, each to its user's.
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	answered := map[string]int{}
	for n := len(delivered); n > 0; n-- {
		m := <-delivered
		for _, u := range users {
			if strings.HasPrefix(m.Subject, natsauth.InboxPrefix(u)+".") {
				answered[u]++
			}
		}
	}
	for _, u := range users {
		if answered[u] == 0 {
			t.Errorf("%s: no answer went to its inboxes (%s.>): %v", u, natsauth.InboxPrefix(u), answered)
		}
	}

	for _, s := range spies {
		for _, subject := range s.subjects {
			s.c.refused(t, "Subscription to", subject)
		}
	}
}

// fetch pulls n messages from cons and acknowledges them.
func fetch(cons jetstream.Consumer, n int) error {
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		return err
	}
	got := 0
	for m := range batch.Messages() {
		if err := m.Ack(); err != nil {
			return err
		}
		got++
	}
	if err := batch.Error(); err != nil {
		return fmt.Errorf("fetched %d messages, want %d: %w", got, n, err)
	}
	if got != n {
		return fmt.Errorf("fetched %d messages, want %d", got, n)
	}
	return nil
}

// get reads key of bucket as its services do: the bucket's info, then a
// direct get.
func get(js jetstream.JetStream, bucket, key string) error {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(c, bucket)
	if err != nil {
		return err
	}
	_, err = kv.Get(c, key)
	return err
}

// A service that authenticates with an nkey (or a creds file) does not
// know its user name, so its inboxes are where -nats-inbox-prefix says:
// the account then grants it that prefix alone, as the users' permission
// sets do. An nkey client with the relay's permissions works with the
// relay's prefix; without one its replies go to the shared _INBOX, which
// it may not subscribe to, so it gets no answer; and another user
// listening on _INBOX.> and on the relay's prefix reads nothing.
func TestAnNKeyClientRepliesOnTheInboxesItIsGiven(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seedBytes, _ := kp.Seed()
	seed := filepath.Join(t.TempDir(), "relay.nk")
	if err := os.WriteFile(seed, seedBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, &server.NkeyUser{Nkey: pub, Permissions: natsauth.Relay()})
	e.docsAsAdmin()

	// The spy: subscriptions the server refuses deliver nothing, which
	// the count at the end shows.
	spy := e.connect(natsauth.UserProducer).nc
	got := make(chan *nats.Msg, 64)
	for _, s := range []string{"_INBOX.>", natsauth.InboxPrefix(natsauth.UserRelay) + ".>"} {
		if _, err := spy.ChanSubscribe(s, got); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	info := func(cfg natsauth.ClientConfig) error {
		opts, err := cfg.Options()
		if err != nil {
			return err
		}
		nc, err := nats.Connect(e.srv.URL, append(opts, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.Stream(c, contract.DocsStream)
		return err
	}
	if err := info(natsauth.ClientConfig{NKeyFile: seed}); err == nil {
		t.Fatal("an nkey client on the shared _INBOX was answered though its permissions allow only " + natsauth.InboxPrefix(natsauth.UserRelay) + ".>")
	}
	if err := info(natsauth.ClientConfig{NKeyFile: seed, InboxPrefix: natsauth.InboxPrefix(natsauth.UserRelay)}); err != nil {
		t.Fatalf("the nkey client with its inbox prefix: %v", err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(got); n > 0 {
		t.Fatalf("the producer read %d of the relay's answers", n)
	}
}
