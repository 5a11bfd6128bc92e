// Package stack is the whole pipeline on one machine: a throwaway
// PostgreSQL (or a given one) with the schema and the relay's slot, an
// embedded NATS server (or a given one), and the writer, the relay, both
// projectors and, when configured, the notifier, each started by its own
// service.Run exactly as its binary starts it. `converge dev` and `converge
// demo` run it, and so do the tests and benchmarks that need the whole
// pipeline.
//
// Postgres is prepared as a deployment is: converge's roles are applied
// (internal/roles) with the administrator's URL, the schema is migrated as
// converge_owner, the relay's slot is created as converge_relay, and the
// writer and the relay connect as converge_writer and converge_relay, with
// passwords made for this stack alone (kept in the Stack's URLs, never
// printed nor logged).
package stack

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/config"
	gbackends "github.com/converge-sync/converge/internal/graph/backends"
	ibackends "github.com/converge-sync/converge/internal/index/backends"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/writer"
)

// Config is the whole pipeline on one machine.
type Config struct {
	DataDir     string // empty: a temporary directory, removed at the end
	PostgresURL string // empty: a throwaway cluster from the machine's binaries
	NATSURL     string // empty: an embedded NATS server
	HTTPAddr    string // the writer's API
	// Metrics addresses of the writer, the relay and the two projectors;
	// the projectors' also serve search, graph and verify.
	WriterAddr, RelayAddr, IndexAddr, GraphAddr string
	Index                                       *ibackends.Config
	Graph                                       *gbackends.Config
	// GraphChild runs the graph projector as a child process
	// (GraphChildPath, default this binary, with the arguments
	// `projector-graph ...`), so that it can be killed; GraphAddrPicked:
	// GraphAddr was picked free by the caller, and may be picked again
	// should another process take it before the child binds it.
	GraphChild, GraphAddrPicked bool
	GraphChildPath              string
	// Notifier, when set, runs the webhook notifier too, with its metrics
	// on NotifierAddr.
	Notifier     *notifier.Config
	NotifierAddr string
	// InfraOnly starts Postgres (with the schema and the slot) and NATS,
	// and none of the services: the caller runs them (the benchmark of the
	// deployed layout, one process per service).
	InfraOnly bool
	Log       *slog.Logger
	LogOut    io.Writer // the child's output
}

// Stack is a running pipeline.
type Stack struct {
	Config      // as started: DataDir and the addresses are the ones in use
	PostgresURL string
	NATSURL     string
	APIURL      string             // the writer's API, http://host:port
	Cluster     *pgcluster.Cluster // nil when PostgresURL was given
	NATS        *natsserver.Server // nil when NATSURL was given
	tempDir     string

	// PostgresURL above is the administrator's (the given one, or the
	// throwaway cluster's superuser on its converge database); these are
	// converge's roles on the same database, with their passwords (never
	// print them): the schema's owner, the writer, the relay, and the
	// read-only role of verify and status.
	OwnerURL, WriterURL, RelayURL, ReaderURL string

	cancel context.CancelFunc
	group  *errgroup.Group
	relay  *relay.Relay // set once it is made

	childMu sync.Mutex
	child   *proc.Child
}

// Start starts Postgres (unless given), NATS (unless given), the schema
// and slot, the writer, the relay and both projectors, and returns once all
// of them are ready.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Index == nil {
		cfg.Index = &ibackends.Config{}
	}
	if cfg.Graph == nil {
		cfg.Graph = &gbackends.Config{}
	}
	s := &Stack{Config: cfg}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if cfg.DataDir == "" {
		if s.tempDir, err = os.MkdirTemp("", "converge-dev-"); err != nil {
			return nil, err
		}
		s.Config.DataDir = s.tempDir
	}
	dir := s.Config.DataDir
	s.Config.Index.DataDir, s.Config.Graph.DataDir = dir, dir

	s.PostgresURL = cfg.PostgresURL
	if s.PostgresURL == "" {
		pgDir := ""
		if s.tempDir == "" {
			pgDir = filepath.Join(dir, "postgres")
		}
		if s.Cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir, Logger: cfg.Log}); err != nil {
			return nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		s.PostgresURL = s.Cluster.URL(roles.DefaultDatabase)
	}
	if err := s.applyRoles(ctx); err != nil {
		return nil, err
	}
	if _, err := schema.Up(ctx, s.OwnerURL); err != nil {
		return nil, err
	}
	if _, err := schema.EnsureSlot(ctx, s.RelayURL, "converge_relay"); err != nil {
		return nil, err
	}

	s.NATSURL = cfg.NATSURL
	if s.NATSURL == "" {
		if s.NATS, err = natsserver.Start(filepath.Join(dir, "nats"), -1); err != nil {
			return nil, fmt.Errorf("start NATS: %w", err)
		}
		s.NATSURL = s.NATS.URL
	}
	if cfg.InfraOnly {
		return s, nil
	}

	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	g, runCtx := errgroup.WithContext(runCtx)
	s.group = g

	listening := make(chan net.Addr, 1)
	g.Go(func() error {
		c := writer.ServiceConfig{PostgresURL: s.WriterURL, NATSURL: s.NATSURL, HTTPAddr: cfg.HTTPAddr,
			MetricsAddr: cfg.WriterAddr, OnListen: func(a net.Addr) { listening <- a }}
		return service.Run(runCtx, c, cfg.Log.With("service", "writer"), writer.Run)
	})
	// The relay ensures the stream too; doing it here first spares the
	// projectors a retry when they start before it.
	if err := ensureStream(ctx, s.NATSURL); err != nil {
		return nil, err
	}
	relays := make(chan *relay.Relay, 1)
	g.Go(func() error {
		c := relay.ServiceConfig{Relay: relay.Config{PostgresURL: s.RelayURL}, NATSURL: s.NATSURL,
			MetricsAddr: cfg.RelayAddr, OnStart: func(r *relay.Relay) { relays <- r }}
		return service.Run(runCtx, c, cfg.Log.With("service", "relay"), relay.Run)
	})
	g.Go(func() error {
		c := ibackends.ServiceConfig{Store: *s.Config.Index, Projector: projector.ServiceConfig{
			NATSURL: s.NATSURL, MetricsAddr: cfg.IndexAddr, Runtime: projector.Config{Name: "index"}}}
		return service.Run(runCtx, c, cfg.Log.With("service", "projector-index"), ibackends.Run)
	})
	if cfg.GraphChild {
		if err := s.StartGraphChild(ctx); err != nil {
			return nil, err
		}
	} else {
		g.Go(func() error {
			c := gbackends.ServiceConfig{Store: *s.Config.Graph, Projector: projector.ServiceConfig{
				NATSURL: s.NATSURL, MetricsAddr: cfg.GraphAddr, Runtime: projector.Config{Name: "graph"}}}
			return service.Run(runCtx, c, cfg.Log.With("service", "projector-graph"), gbackends.Run)
		})
	}
	if cfg.Notifier != nil {
		g.Go(func() error {
			c := notifier.ServiceConfig{Notifier: *cfg.Notifier, Projector: projector.ServiceConfig{
				NATSURL: s.NATSURL, MetricsAddr: cfg.NotifierAddr, Runtime: projector.Config{Name: "notifier"}}}
			return service.Run(runCtx, c, cfg.Log.With("service", "notifier"), notifier.Run)
		})
	}

	// Ready: the writer listens, the relay holds its slot, both projectors
	// answer /readyz.
	deadline := time.After(60 * time.Second)
	for s.APIURL == "" || s.relay == nil {
		select {
		case a := <-listening:
			s.APIURL = "http://" + a.String()
		case s.relay = <-relays:
		case <-deadline:
			return nil, errors.New("the writer and the relay did not start within 60s")
		case <-runCtx.Done():
			return nil, fmt.Errorf("a service failed to start: %w", g.Wait())
		}
	}
	for _, c := range []struct {
		what  string
		ready func() bool
	}{
		{"the relay to hold its slot", s.relay.Active},
		{"the index projector", func() bool { return HTTPOK("http://" + cfg.IndexAddr + "/readyz") }},
		{"the graph projector", func() bool { return HTTPOK("http://" + s.Config.GraphAddr + "/readyz") }},
	} {
		if err := WaitUntil(ctx, runCtx, 60*time.Second, c.ready); err != nil {
			return nil, fmt.Errorf("waiting for %s: %w", c.what, err)
		}
	}
	return s, nil
}

// ensureStream creates the stream unless it exists.
func ensureStream(ctx context.Context, natsURL string) error {
	nc, err := nats.Connect(natsURL, nats.Name("converge-dev"))
	if err != nil {
		return fmt.Errorf("connect NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		return fmt.Errorf("create the stream: %w", err)
	}
	return nil
}

// applyRoles applies converge's roles to the database of PostgresURL (the
// throwaway cluster's is created then), each with a new random password,
// and sets the roles' URLs.
func (s *Stack) applyRoles(ctx context.Context) error {
	u, err := url.Parse(s.PostgresURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return errors.New("the Postgres URL must be postgres://...: the stack derives its roles' URLs from it")
	}
	admin := s.PostgresURL
	if s.Cluster != nil {
		admin = s.Cluster.URL("postgres") // the database may not exist yet
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	opts := roles.Options{Database: strings.TrimPrefix(u.Path, "/"), Passwords: map[string]string{}}
	urls := map[string]*string{roles.Owner: &s.OwnerURL, roles.Writer: &s.WriterURL, roles.Relay: &s.RelayURL, roles.Reader: &s.ReaderURL}
	for _, name := range roles.Names() {
		pw := rand.Text() // 26 characters of base32: printable, URL-safe
		opts.Passwords[name] = pw
		if *urls[name], err = roles.URL(s.PostgresURL, name, pw); err != nil {
			return err
		}
	}
	if _, err := roles.Apply(ctx, conn, opts); err != nil {
		return fmt.Errorf("apply the roles (the Postgres URL must be a superuser's): %w", err)
	}
	return nil
}

// StartGraphChild starts `converge projector-graph` as a child process
// and waits until it is ready (or ctx ends). A child that exits before
// (its metrics address taken by another process since it was picked, say)
// is started again on a fresh address when the address was picked here.
func (s *Stack) StartGraphChild(ctx context.Context) error {
	exe := s.Config.GraphChildPath
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	for attempt := 1; ; attempt++ {
		addr := s.Config.GraphAddr
		// The demo SIGKILLs this child: with a short ack wait, what it
		// had in flight is delivered again to the next one within
		// seconds rather than after the default minute.
		c, err := proc.Start(exe, []string{"projector-graph", "-nats-url", s.NATSURL, "-data-dir", s.Config.DataDir,
			"-metrics-addr", addr, "-log-level", "warn", "-ack-wait", "5s"},
			// A projector holds no Postgres credentials, and refuses to
			// start with them: dev's own are not passed on.
			proc.Options{Out: s.Config.LogOut, Unset: []string{config.EnvPostgresURL, config.EnvPostgresURL + "_FILE"}})
		if err != nil {
			return fmt.Errorf("start the graph projector: %w", err)
		}
		s.childMu.Lock()
		s.child = c // stopped by stop, whatever happens next
		s.childMu.Unlock()
		if err := WaitUntil(ctx, ctx, 60*time.Second, func() bool { return c.Exited() || HTTPOK("http://"+addr+"/readyz") }); err != nil {
			return fmt.Errorf("waiting for the graph projector: %w", err)
		}
		if !c.Exited() {
			return nil
		}
		s.childMu.Lock()
		s.child = nil
		s.childMu.Unlock()
		if !s.Config.GraphAddrPicked || attempt == 3 {
			return fmt.Errorf("the graph projector exited while starting: %w", c.Err())
		}
		if s.Config.GraphAddr, err = FreeAddr(); err != nil {
			return err
		}
	}
}

// KillGraphChild SIGKILLs the graph projector child and reaps it.
func (s *Stack) KillGraphChild() error {
	s.childMu.Lock()
	c := s.child
	s.child = nil
	s.childMu.Unlock()
	if c == nil {
		return errors.New("no graph projector child runs")
	}
	c.Kill()
	return nil
}

// stop stops every service, then NATS and Postgres, and removes a
// temporary data directory.
func (s *Stack) Stop() error {
	var errs []error
	s.childMu.Lock()
	if c := s.child; c != nil {
		_ = c.Stop(30 * time.Second)
		s.child = nil
	}
	s.childMu.Unlock()
	if s.cancel != nil {
		s.cancel()
		if err := s.group.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if s.NATS != nil {
		s.NATS.Shutdown()
	}
	if s.Cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		if s.tempDir != "" {
			err = s.Cluster.Stop(ctx)
		} else {
			err = s.Cluster.StopKeep(ctx)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if s.tempDir != "" {
		if err := os.RemoveAll(s.tempDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// HTTPOK reports whether GET u answers 200 within 2s.
func HTTPOK(u string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// WaitUntil polls cond until it holds, either context ends, or timeout.
func WaitUntil(ctx, run context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-run.Done():
			return errors.New("a service stopped")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// FreeAddr returns a free 127.0.0.1 address.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// Done is closed when a service of the stack has stopped (each runs until
// Stop, so: failed).
func (s *Stack) Done() <-chan struct{} {
	ch := make(chan struct{})
	if s.group == nil {
		return ch
	}
	go func() { _ = s.group.Wait(); close(ch) }()
	return ch
}
