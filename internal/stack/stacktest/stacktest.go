// Package stacktest is the harness of the tests that run converge's
// services inside the test process: [New] makes a migrated database with
// the relay's slot and an embedded NATS server, and [Start] (or one of
// [StartWriter], [StartRelay], [StartProjector]) runs a service by the very
// entry point its binary uses, service.Run over the service's Run. Every
// service is stopped when the test ends, before the database and NATS go:
// its context is canceled and its Run has returned. Services stop in the
// reverse order of their start, so consumers stop before what feeds them.
//
// NATS admits every client unless the Stack is made [WithNATSUsers]: then
// the server admits only the users of internal/natsauth, each with a
// password made for the test, and the Stack's Start methods
// ([Stack.StartWriter], [Stack.StartRelay], [Stack.StartProjector]) give
// each service its own user, as a deployment does.
//
// The package imports the writer, the relay and the projector runtime, so
// only their external test packages can use it; the notifier's own tests
// run notifier.Run through [Start].
package stacktest

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

// slot is the replication slot New creates: the relay's default.
const slot = "converge_relay"

// startTimeout bounds how long a service may take to listen or to hold
// its slot.
const startTimeout = 30 * time.Second

// Stack is what a test's services run over.
type Stack struct {
	// PostgresURL is a database holding the schema and the relay's slot,
	// created before anything is written, so that the relay sees every
	// write; Pool is a pool on it. Both are empty for a Stack without
	// Postgres.
	PostgresURL string
	Pool        *pgxpool.Pool
	// WriterURL and RelayURL are PostgresURL as converge_writer and
	// converge_relay (internal/roles, applied by New): the Stack's writer
	// and relay run as their roles, as deployed. The test cluster trusts
	// local connections, so they carry no password.
	WriterURL, RelayURL string
	NATS                *testenv.NATS
	// JetStream is the test's own connection, allowed everything (with
	// [WithNATSUsers], as the harness's user, HarnessUser).
	JetStream jetstream.JetStream

	natsPasswords map[string]string // by user; nil: NATS admits everyone
}

// HarnessUser is the NATS user of the Stack's own connection
// (Stack.JetStream) on a server [WithNATSUsers]: it may do anything, as the
// test that set up what the services consume must.
const HarnessUser = "stacktest"

// Option changes what [New] starts.
type Option func(*options)

type options struct{ natsUsers bool }

// WithNATSUsers starts NATS admitting only the users of internal/natsauth
// (natsauth.Users), each with a random password, and [HarnessUser]; see
// [Stack.NATSAuth].
func WithNATSUsers() Option { return func(o *options) { o.natsUsers = true } }

// New makes a migrated database with the relay's slot in pg (none when pg
// is nil: a test of services that hold no Postgres credentials) and
// starts an embedded NATS server; both go when the test ends, after its
// services have stopped. The documents' stream is not created: the relay
// creates it, or the test.
func New(t testing.TB, pg *testenv.Postgres, opts ...Option) *Stack {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &Stack{}
	if pg != nil {
		s.PostgresURL = pg.MigratedDatabase(t)
		ctx := context.Background()
		applyRoles(t, s)
		if _, err := schema.EnsureSlot(ctx, s.PostgresURL, slot); err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, s.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		// Slots are the cluster's: this one must go before the database
		// can be dropped, and before the next test creates its own.
		t.Cleanup(func() { dropSlots(t, pool) })
		s.Pool = pool
	}
	if !o.natsUsers {
		s.NATS = testenv.StartNATS(t)
		js, err := jetstream.New(s.NATS.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		s.JetStream = js
		return s
	}
	s.natsPasswords = map[string]string{}
	for name := range natsauth.Permissions() {
		s.natsPasswords[name] = rand.Text()
	}
	harness := rand.Text()
	users := append(natsauth.Users(s.natsPasswords), &server.User{Username: HarnessUser, Password: harness})
	ns, err := natsserver.StartWith(natsserver.Options{StoreDir: t.TempDir(), Port: -1, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	s.NATS = &testenv.NATS{Server: ns}
	nc, err := nats.Connect(ns.URL, nats.Name(t.Name()), nats.UserInfo(HarnessUser, harness))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if s.JetStream, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return s
}

// NATSAuth is the credentials of user (a natsauth user name) on a Stack
// [WithNATSUsers]; zero without it. A user the server does not know fails
// the test: a service given none would be refused.
func (s *Stack) NATSAuth(t testing.TB, user string) natsauth.ClientConfig {
	t.Helper()
	if s.natsPasswords == nil {
		return natsauth.ClientConfig{}
	}
	pw := s.natsPasswords[user]
	if pw == "" {
		t.Fatalf("stacktest: NATS has no user %q (natsauth.Permissions names its users)", user)
	}
	return natsauth.ClientConfig{User: user, Password: pw}
}

// StartWriter is [StartWriter] over the Stack: the database when
// cfg.PostgresURL is empty, and the writer's NATS user when cfg.NATSURL
// (the ingest consumer) is the Stack's and cfg.NATSAuth is zero.
func (s *Stack) StartWriter(t testing.TB, cfg writer.ServiceConfig) (string, *Service) {
	t.Helper()
	if cfg.PostgresURL == "" {
		cfg.PostgresURL = s.WriterURL
	}
	if cfg.NATSURL == s.NATS.URL && cfg.NATSAuth == (natsauth.ClientConfig{}) {
		cfg.NATSAuth = s.NATSAuth(t, natsauth.UserWriter)
	}
	return StartWriter(t, cfg)
}

// StartRelay is [StartRelay] over the Stack: its database and NATS where
// cfg leaves them empty, as the relay's own user.
func (s *Stack) StartRelay(t testing.TB, cfg relay.ServiceConfig) (*relay.Relay, *Service) {
	t.Helper()
	if cfg.Relay.PostgresURL == "" {
		cfg.Relay.PostgresURL = s.RelayURL
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = s.NATS.URL
	}
	if cfg.NATSURL == s.NATS.URL && cfg.NATSAuth == (natsauth.ClientConfig{}) {
		cfg.NATSAuth = s.NATSAuth(t, natsauth.UserRelay)
	}
	return StartRelay(t, cfg)
}

// StartProjector is [StartProjector] over the Stack's NATS (where
// sc.NATSURL is empty), as the projector's own user,
// natsauth.ProjectorUser(sc.Runtime.Name): with [WithNATSUsers] the name is
// one natsauth knows (index or graph).
func (s *Stack) StartProjector(t testing.TB, sc projector.ServiceConfig, store projector.Store, routes map[string]http.Handler) *Service {
	t.Helper()
	if sc.NATSURL == "" {
		sc.NATSURL = s.NATS.URL
	}
	if sc.NATSURL == s.NATS.URL && sc.NATSAuth == (natsauth.ClientConfig{}) {
		sc.NATSAuth = s.NATSAuth(t, natsauth.ProjectorUser(sc.Runtime.Name))
	}
	return StartProjector(t, sc, store, routes)
}

// Service is a service running in the test.
type Service struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's, once done is closed

	mu      sync.Mutex
	stopped bool // Stop was called: its caller has Run's error
}

// Start runs run with cfg through service.Run, exactly as the service's
// binary runs it (cfg is validated, its connections dialed), until Stop
// or the end of the test. A service that was not stopped by the test
// fails it if its Run returns an error.
func Start[C service.Config](t testing.TB, cfg C, run func(context.Context, C, service.Deps) error) *Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = service.Run(ctx, cfg, slog.New(slog.DiscardHandler), run)
	}()
	t.Cleanup(func() {
		s.mu.Lock()
		checked := s.stopped
		s.mu.Unlock()
		if err := s.Stop(); err != nil && !checked {
			t.Errorf("stacktest: %T: %v", cfg, err)
		}
	})
	return s
}

// Stop cancels the service's context and waits for its Run to return;
// it returns Run's error (nil for a clean stop). It may be called again.
func (s *Service) Stop() error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
	return s.err
}

// Done is closed once the service's Run has returned.
func (s *Service) Done() <-chan struct{} { return s.done }

// StartWriter starts writer.Run with cfg (HTTPAddr empty: a free port)
// and returns its API's URL, http://host:port, once it listens. The
// ingest consumer runs when cfg.NATSURL is set.
func StartWriter(t testing.TB, cfg writer.ServiceConfig) (string, *Service) {
	t.Helper()
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	listening := make(chan net.Addr, 1)
	onListen := cfg.OnListen
	cfg.OnListen = func(a net.Addr) {
		if onListen != nil {
			onListen(a)
		}
		listening <- a
	}
	s := Start(t, cfg, writer.Run)
	select {
	case a := <-listening:
		return "http://" + a.String(), s
	case <-s.Done():
		t.Fatalf("stacktest: the writer stopped before it listened: %v", s.Stop())
	case <-time.After(startTimeout):
		t.Fatalf("stacktest: the writer did not listen within %v", startTimeout)
	}
	return "", nil
}

// StartRelay starts relay.Run with cfg and returns the relay once it
// holds its slot.
func StartRelay(t testing.TB, cfg relay.ServiceConfig) (*relay.Relay, *Service) {
	t.Helper()
	started := make(chan *relay.Relay, 1)
	onStart := cfg.OnStart
	cfg.OnStart = func(r *relay.Relay) {
		if onStart != nil {
			onStart(r)
		}
		started <- r
	}
	s := Start(t, cfg, relay.Run)
	deadline := time.After(startTimeout)
	var r *relay.Relay
	for r == nil || !r.Active() {
		select {
		case r = <-started:
		case <-s.Done():
			t.Fatalf("stacktest: the relay stopped before it held its slot: %v", s.Stop())
		case <-deadline:
			t.Fatalf("stacktest: the relay did not hold its slot within %v", startTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return r, s
}

// StartProjector starts the projector service over the test's own store,
// projector.RunService with sc, store and routes (served on
// sc.MetricsAddr beside /metrics and /readyz), as a projector's binary
// runs it over the store it opens.
func StartProjector(t testing.TB, sc projector.ServiceConfig, store projector.Store, routes map[string]http.Handler) *Service {
	t.Helper()
	return Start(t, sc, func(ctx context.Context, sc projector.ServiceConfig, deps service.Deps) error {
		return projector.RunService(ctx, sc, store, routes, deps)
	})
}

// dropSlots drops the database's replication slots once no relay holds
// them: a stopped relay's server process may outlive its connection for a
// moment.
func dropSlots(t testing.TB, pool *pgxpool.Pool) {
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&left)
		if err == nil && left == 0 {
			return
		}
		if err == nil {
			_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		}
		if time.Now().After(deadline) {
			t.Errorf("stacktest: %d replication slots left in the test's database: %v", left, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// applyRoles applies converge's roles to the Stack's database (without
// passwords: a role keeps the one it has) and makes the writer's and the
// relay's URLs.
func applyRoles(t testing.TB, s *Stack) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := roles.Apply(ctx, conn, roles.Options{Database: conn.Config().Database}); err != nil {
		t.Fatalf("apply the roles: %v", err)
	}
	if s.WriterURL, err = roles.URL(s.PostgresURL, roles.Writer, ""); err != nil {
		t.Fatal(err)
	}
	if s.RelayURL, err = roles.URL(s.PostgresURL, roles.Relay, ""); err != nil {
		t.Fatal(err)
	}
}
