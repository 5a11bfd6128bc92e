package natsauth_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/pkg/contract"
)

// admin is a user of the test server allowed everything: it sets up what
// the users under test find (streams, other consumers, other buckets).
const admin = "test-admin"

func password(user string) string { return "pw-" + user }

// env is an embedded server admitting the users of natsauth.Users, admin
// and the nkey users a test adds.
type env struct {
	t   *testing.T
	srv *natsserver.Server
	tap *nats.Conn

	marks     chan string // the tap's own marks, as its handler reaches them
	nmarks    int
	mu        sync.Mutex
	recording []string // the users whose grants the subjects published now use
	subjects  []string
}

// tapMark prefixes the subjects the tap publishes to itself: its handler
// takes messages in order, so once it reaches a mark it has taken every
// message the server sent it before.
const tapMark = "converge.test.tapmark."

func newEnv(t *testing.T, nkeys ...*server.NkeyUser) *env {
	t.Helper()
	pw := map[string]string{}
	for name := range natsauth.Permissions() {
		pw[name] = password(name)
	}
	users := append(natsauth.Users(pw), &server.User{Username: admin, Password: password(admin)})
	srv, err := natsserver.StartWith(natsserver.Options{StoreDir: t.TempDir(), Users: users, Nkeys: nkeys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	e := &env{t: t, srv: srv}
	// The tap sees every publish, JetStream's API requests and
	// acknowledgements included.
	tap, err := nats.Connect(srv.URL, nats.UserInfo(admin, password(admin)), nats.Name("tap"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tap.Close)
	e.marks = make(chan string, 1)
	sub, err := tap.Subscribe(">", func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, tapMark) {
			e.marks <- m.Subject
			return
		}
		e.mu.Lock()
		if len(e.recording) > 0 {
			e.subjects = append(e.subjects, m.Subject)
		}
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := tap.Flush(); err != nil {
		t.Fatal(err)
	}
	e.tap = tap
	return e
}

// record attributes what is published from now on, until [env.used], to
// the grants of users: the setup of a test is done by then, and only the
// users under test publish.
func (e *env) record(users ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.recording, e.subjects = users, nil
}

// used marks the grants of the recorded users that a subject published
// since [env.record] matched.
func (e *env) used(clients ...*client) {
	t := e.t
	t.Helper()
	for _, c := range clients {
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Each client's round trip put its publishes before the server's
	// answer; the tap's mark, published after, reaches the tap's handler
	// after every message the server sent it for them.
	e.nmarks++
	mark := fmt.Sprintf("%s%d", tapMark, e.nmarks)
	if err := e.tap.Publish(mark, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-e.marks:
		if got != mark {
			t.Fatalf("the tap reached mark %s, want %s", got, mark)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the tap's handler did not reach its mark %s within 10s", mark)
	}
	e.mu.Lock()
	users, subjects := e.recording, e.subjects
	e.recording, e.subjects = nil, nil
	e.mu.Unlock()
	perms := natsauth.Permissions()
	grantsUsed.Lock()
	defer grantsUsed.Unlock()
	for _, u := range users {
		for _, grant := range perms[u].Publish.Allow {
			for _, s := range subjects {
				if matchSubject(grant, s) {
					if grantsUsed.m[u] == nil {
						grantsUsed.m[u] = map[string]bool{}
					}
					grantsUsed.m[u][grant] = true
				}
			}
		}
	}
}

// grantsUsed are the publish grants, by user, that the positive tests
// used; TestMain reports any other.
var grantsUsed = struct {
	sync.Mutex
	m map[string]map[string]bool
}{m: map[string]map[string]bool{}}

// matchSubject reports whether subject matches pattern, with NATS
// wildcards: * one token, > one or more at the end.
func matchSubject(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// client is a connection as one user, with the handler a service installs
// (natsauth.ErrorHandler) and what it logged and counted.
type client struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu       sync.Mutex
	errs     []string // the asynchronous errors, in order, without the barriers'
	log      bytes.Buffer
	count    func() float64 // refusals counted, without the barriers'
	barriers int
	reached  chan string
}

// barrierPrefix names the subjects a client subscribes to as a barrier:
// no user may, and the server's refusal reaches the client's error handler
// after every error the server sent before it (nats.go runs the handler
// for each in order, on its own goroutine).
const barrierPrefix = "converge.test.barrier."

// settle waits until c's error handler has run for every error the server
// sent c before now.
func (c *client) settle(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	c.barriers++
	subject := fmt.Sprintf("%s%d", barrierPrefix, c.barriers)
	c.mu.Unlock()
	sub, err := c.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case got := <-c.reached:
			if got == subject {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the refusal of the barrier %s did not reach the error handler within 10s", c.user, subject)
		}
	}
}

func (e *env) connect(user string) *client {
	t := e.t
	t.Helper()
	c := &client{user: user}
	counter := natsauth.DeniedCounter(nil)
	c.reached = make(chan string, 1)
	c.count = func() float64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return testutil.ToFloat64(counter) - float64(c.barriers)
	}
	handler := natsauth.ErrorHandler(config.NewLogger(&lockedWriter{mu: &c.mu, w: &c.log}, "info"), counter)
	ac := natsauth.ClientConfig{User: user, Password: password(user)}
	opts, err := ac.Options()
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, nats.Name("test-"+user), nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		handler(nc, sub, err)
		// The server names the subject it refused: `... Subscription to
		// "converge.test.barrier.1"`.
		if _, rest, ok := strings.Cut(err.Error(), `Subscription to "`+barrierPrefix); ok {
			c.reached <- barrierPrefix + strings.TrimSuffix(rest, `"`)
			return
		}
		c.mu.Lock()
		c.errs = append(c.errs, err.Error())
		c.mu.Unlock()
	}))
	nc, err := nats.Connect(e.srv.URL, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// refused waits for the server's refusal of op on subject (its exact text,
// as the server sends it), and checks that the handler logged it at error
// level naming the subject and counted it.
func (c *client) refused(t *testing.T, op, subject string) {
	t.Helper()
	want := "Permissions Violation for " + op + " " + quote(subject)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		var found bool
		for _, e := range c.errs {
			if strings.Contains(e, want) {
				found = true
			}
		}
		logged := c.log.String()
		c.mu.Unlock()
		if found {
			if !strings.Contains(logged, `"level":"ERROR"`) || !strings.Contains(logged, `"subject":`+quote(subject)) {
				t.Errorf("%s: the refusal of %s is not logged at error level with its subject:\n%s", c.user, subject, logged)
			}
			if c.count() == 0 {
				t.Errorf("%s: the refusal of %s is not counted", c.user, subject)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no refusal %q within 5s; the server sent: %q", c.user, want, c.errors())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allowed checks that the server refused nothing to c: a round trip
// (every error the server sent before it has been read), then its errors.
func (c *client) allowed(t *testing.T) {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatalf("%s: flush: %v", c.user, err)
	}
	if err := c.nc.LastError(); err != nil && !strings.Contains(err.Error(), barrierPrefix) {
		t.Errorf("%s: the server refused: %v", c.user, err)
	}
	c.settle(t)
	if errs := c.errors(); len(errs) > 0 {
		t.Errorf("%s: the server refused: %q", c.user, errs)
	}
}

func (c *client) errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.errs...)
}

func quote(s string) string { return `"` + s + `"` }

// ctx is a context for one call that may be refused: a refused request
// gets no answer.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// docsAsAdmin connects admin, creates CONVERGE_DOCS as the relay does and
// publishes version 1 of each of keys there, and returns admin's client.
func (e *env) docsAsAdmin(keys ...string) *client {
	e.t.Helper()
	a := e.connect(admin)
	docsStream(e.t, a.js)
	for _, key := range keys {
		publishEvent(e.t, a.js, upsert(e.t, key, 1))
	}
	return a
}

// docsStream creates CONVERGE_DOCS as the relay does.
func docsStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := relay.EnsureStream(context.Background(), js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
}

func upsert(t *testing.T, key string, version int64) contract.Event {
	t.Helper()
	d, err := contract.Document{Key: key, Version: version, Title: "t", Body: "body of " + key}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return contract.NewUpsertedEvent(d, []string{d.Body})
}

// publishEvent publishes ev to its subject as the relay does, with its id
// and commit time.
func publishEvent(t *testing.T, js jetstream.JetStream, ev contract.Event) *jetstream.PubAck {
	t.Helper()
	return publishEventTo(t, js, contract.Subject, ev)
}

// publishEventTo publishes ev on subject(ev.Key), as the relay does.
func publishEventTo(t *testing.T, js jetstream.JetStream, subject func(string) string, ev contract.Event) *jetstream.PubAck {
	t.Helper()
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subject(ev.Key))
	m.Data = data
	m.Header.Set(contract.HeaderCommitTime, time.Now().UTC().Format(time.RFC3339Nano))
	ack, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(ev.ID.String()))
	if err != nil {
		t.Fatalf("publish %s: %v", m.Subject, err)
	}
	return ack
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
