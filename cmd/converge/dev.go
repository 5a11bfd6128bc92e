package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/writer"
)

// devConfig is the whole pipeline on one machine.
type devConfig struct {
	dataDir     string // empty: a temporary directory, removed at the end
	postgresURL string // empty: a throwaway cluster from the machine's binaries
	natsURL     string // empty: an embedded NATS server
	httpAddr    string // the writer's API
	// Metrics addresses of the writer, the relay and the two projectors;
	// the projectors' also serve search, graph and verify.
	writerAddr, relayAddr, indexAddr, graphAddr string
	index                                       *ibackends.Config
	graph                                       *gbackends.Config
	// graphChild runs the graph projector as a child process (this binary,
	// `converge projector-graph`), so that it can be killed;
	// graphAddrPicked: graphAddr was picked free here, and may be picked
	// again should another process take it before the child binds it.
	graphChild, graphAddrPicked bool
	// notifier, when set (CONVERGE_WEBHOOK_URLS), runs the webhook
	// notifier too, with its metrics on notifierAddr.
	notifier     *notifier.Config
	notifierAddr string
	// infraOnly starts Postgres (with the schema and the slot) and NATS,
	// and none of the services: the caller runs them (the benchmark of
	// the deployed layout, one process per service).
	infraOnly bool
	log       *slog.Logger
	logOut    io.Writer // the child's output
}

// devStack is a running pipeline.
type devStack struct {
	cfg         devConfig
	postgresURL string
	natsURL     string
	apiURL      string
	cluster     *pgcluster.Cluster
	nats        *natsserver.Server
	tempDir     string

	cancel context.CancelFunc
	group  *errgroup.Group
	relay  *relay.Relay // set once it is made

	childMu sync.Mutex
	child   *proc.Child
}

// startDev starts Postgres (unless given), NATS (unless given), the schema
// and slot, the writer, the relay and both projectors, and returns once all
// of them are ready.
func startDev(ctx context.Context, cfg devConfig) (_ *devStack, err error) {
	s := &devStack{cfg: cfg}
	defer func() {
		if err != nil {
			_ = s.stop()
		}
	}()
	if cfg.dataDir == "" {
		if s.tempDir, err = os.MkdirTemp("", "converge-dev-"); err != nil {
			return nil, err
		}
		s.cfg.dataDir = s.tempDir
	}
	dir := s.cfg.dataDir
	s.cfg.index.DataDir, s.cfg.graph.DataDir = dir, dir

	s.postgresURL = cfg.postgresURL
	if s.postgresURL == "" {
		pgDir := ""
		if s.tempDir == "" {
			pgDir = filepath.Join(dir, "postgres")
		}
		if s.cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir, Logger: cfg.log}); err != nil {
			return nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		if s.postgresURL, err = createDatabase(ctx, s.cluster, "converge"); err != nil {
			return nil, err
		}
	}
	if _, err := schema.Up(ctx, s.postgresURL); err != nil {
		return nil, err
	}
	if _, err := schema.EnsureSlot(ctx, s.postgresURL, "converge_relay"); err != nil {
		return nil, err
	}

	s.natsURL = cfg.natsURL
	if s.natsURL == "" {
		if s.nats, err = natsserver.Start(filepath.Join(dir, "nats"), -1); err != nil {
			return nil, fmt.Errorf("start NATS: %w", err)
		}
		s.natsURL = s.nats.URL
	}
	if cfg.infraOnly {
		return s, nil
	}

	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	g, runCtx := errgroup.WithContext(runCtx)
	s.group = g

	listening := make(chan net.Addr, 1)
	g.Go(func() error {
		c := writer.ServiceConfig{PostgresURL: s.postgresURL, NATSURL: s.natsURL, HTTPAddr: cfg.httpAddr,
			MetricsAddr: cfg.writerAddr, OnListen: func(a net.Addr) { listening <- a }}
		return service.Run(runCtx, c, cfg.log.With("service", "writer"), writer.Run)
	})
	// The relay ensures the stream too; doing it here first spares the
	// projectors a retry when they start before it.
	if err := ensureStream(ctx, s.natsURL); err != nil {
		return nil, err
	}
	relays := make(chan *relay.Relay, 1)
	g.Go(func() error {
		c := relay.ServiceConfig{Relay: relay.Config{PostgresURL: s.postgresURL}, NATSURL: s.natsURL,
			MetricsAddr: cfg.relayAddr, OnStart: func(r *relay.Relay) { relays <- r }}
		return service.Run(runCtx, c, cfg.log.With("service", "relay"), relay.Run)
	})
	g.Go(func() error {
		c := ibackends.ServiceConfig{Store: *s.cfg.index, Projector: projector.ServiceConfig{
			NATSURL: s.natsURL, MetricsAddr: cfg.indexAddr, Runtime: projector.Config{Name: "index"}}}
		return service.Run(runCtx, c, cfg.log.With("service", "projector-index"), ibackends.Run)
	})
	if cfg.graphChild {
		if err := s.startGraphChild(ctx); err != nil {
			return nil, err
		}
	} else {
		g.Go(func() error {
			c := gbackends.ServiceConfig{Store: *s.cfg.graph, Projector: projector.ServiceConfig{
				NATSURL: s.natsURL, MetricsAddr: cfg.graphAddr, Runtime: projector.Config{Name: "graph"}}}
			return service.Run(runCtx, c, cfg.log.With("service", "projector-graph"), gbackends.Run)
		})
	}
	if cfg.notifier != nil {
		g.Go(func() error {
			c := notifier.ServiceConfig{Notifier: *cfg.notifier, Projector: projector.ServiceConfig{
				NATSURL: s.natsURL, MetricsAddr: cfg.notifierAddr, Runtime: projector.Config{Name: "notifier"}}}
			return service.Run(runCtx, c, cfg.log.With("service", "notifier"), notifier.Run)
		})
	}

	// Ready: the writer listens, the relay holds its slot, both projectors
	// answer /readyz.
	deadline := time.After(60 * time.Second)
	for s.apiURL == "" || s.relay == nil {
		select {
		case a := <-listening:
			s.apiURL = "http://" + a.String()
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
		{"the index projector", func() bool { return httpOK("http://" + cfg.indexAddr + "/readyz") }},
		{"the graph projector", func() bool { return httpOK("http://" + s.cfg.graphAddr + "/readyz") }},
	} {
		if err := waitUntil(ctx, runCtx, 60*time.Second, c.ready); err != nil {
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

// createDatabase creates name in the cluster unless it exists.
func createDatabase(ctx context.Context, c *pgcluster.Cluster, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", fmt.Errorf("create database %s: %w", name, err)
		}
	}
	return c.URL(name), nil
}

// startGraphChild starts `converge projector-graph` as a child process
// and waits until it is ready (or ctx ends). A child that exits before
// (its metrics address taken by another process since it was picked, say)
// is started again on a fresh address when the address was picked here.
func (s *devStack) startGraphChild(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		addr := s.cfg.graphAddr
		// The demo SIGKILLs this child: with a short ack wait, what it
		// had in flight is delivered again to the next one within
		// seconds rather than after the default minute.
		c, err := proc.Start(exe, []string{"projector-graph", "-nats-url", s.natsURL, "-data-dir", s.cfg.dataDir,
			"-metrics-addr", addr, "-log-level", "warn", "-ack-wait", "5s"}, proc.Options{Out: s.cfg.logOut})
		if err != nil {
			return fmt.Errorf("start the graph projector: %w", err)
		}
		s.childMu.Lock()
		s.child = c // stopped by stop, whatever happens next
		s.childMu.Unlock()
		if err := waitUntil(ctx, ctx, 60*time.Second, func() bool { return c.Exited() || httpOK("http://"+addr+"/readyz") }); err != nil {
			return fmt.Errorf("waiting for the graph projector: %w", err)
		}
		if !c.Exited() {
			return nil
		}
		s.childMu.Lock()
		s.child = nil
		s.childMu.Unlock()
		if !s.cfg.graphAddrPicked || attempt == 3 {
			return fmt.Errorf("the graph projector exited while starting: %w", c.Err())
		}
		if s.cfg.graphAddr, err = freeAddr(); err != nil {
			return err
		}
	}
}

// killGraphChild SIGKILLs the graph projector child and reaps it.
func (s *devStack) killGraphChild() error {
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
func (s *devStack) stop() error {
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
	if s.nats != nil {
		s.nats.Shutdown()
	}
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		if s.tempDir != "" {
			err = s.cluster.Stop(ctx)
		} else {
			err = s.cluster.StopKeep(ctx)
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

func httpOK(u string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitUntil polls cond until it holds, either context ends, or timeout.
func waitUntil(ctx, run context.Context, timeout time.Duration, cond func() bool) error {
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

// devFlags binds the flags dev and demo share.
func devFlags(f *config.Flags, defaults devConfig) func() (devConfig, error) {
	dataDir := f.String("data-dir", "", defaults.dataDir, "keep all state (Postgres, NATS, index, graph) here; empty: a temporary directory removed at exit")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "use this Postgres instead of a throwaway cluster")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "use this NATS server instead of an embedded one")
	httpAddr := f.String("http-addr", config.EnvHTTPAddr, defaults.httpAddr, "the writer's API")
	writerAddr := f.String("writer-metrics-addr", "", defaults.writerAddr, "the writer's /metrics")
	relayAddr := f.String("relay-metrics-addr", "", defaults.relayAddr, "the relay's /metrics")
	indexAddr := f.String("index-addr", "CONVERGE_PROJECTOR_INDEX_ADDR", defaults.indexAddr, "the index projector's /metrics, search and verify")
	graphAddr := f.String("graph-addr", "CONVERGE_PROJECTOR_GRAPH_ADDR", defaults.graphAddr, "the graph projector's /metrics, graph and verify")
	level := f.String("log-level", config.EnvLogLevel, "warn", "debug, info, warn or error")
	return func() (devConfig, error) {
		c := defaults
		c.dataDir, c.postgresURL, c.natsURL, c.httpAddr = *dataDir, *pg, *natsURL, *httpAddr
		c.writerAddr, c.relayAddr, c.indexAddr, c.graphAddr = *writerAddr, *relayAddr, *indexAddr, *graphAddr
		c.log = config.NewLogger(os.Stderr, *level)
		c.logOut = os.Stderr
		c.index = &ibackends.Config{QdrantCollection: "converge_chunks", QdrantBatch: 128, QdrantParallel: 2}
		c.index.QdrantURL, _, _ = config.Lookup(ibackends.EnvQdrantURL)
		c.index.QdrantAPIKey, _, _ = config.Lookup(ibackends.EnvQdrantAPIKey)
		c.graph = &gbackends.Config{Neo4jDatabase: "neo4j", Neo4jBatch: 100, Neo4jUser: "neo4j"}
		c.graph.Neo4jURL, _, _ = config.Lookup(gbackends.EnvNeo4jURL)
		if u, ok, _ := config.Lookup(gbackends.EnvNeo4jUser); ok {
			c.graph.Neo4jUser = u
		}
		c.graph.Neo4jPassword, _, _ = config.Lookup(gbackends.EnvNeo4jPassword)
		var err error
		c.notifier, err = notifier.FromEnv()
		return c, err
	}
}

var devDefaults = devConfig{httpAddr: "127.0.0.1:8080", writerAddr: "127.0.0.1:9101", relayAddr: "127.0.0.1:9102",
	indexAddr: "127.0.0.1:9103", graphAddr: "127.0.0.1:9104", notifierAddr: notifier.DefaultMetricsAddr}

// dev runs the whole pipeline in this process until interrupted.
func dev(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dev")
	flags := devFlags(f, devDefaults)
	if err := f.Parse(args); err != nil {
		return err
	}
	cfg, err := flags()
	if err != nil {
		return err
	}
	notifies := "off (set CONVERGE_WEBHOOK_URLS and CONVERGE_WEBHOOK_SECRET to run it)"
	if cfg.notifier != nil {
		notifies = fmt.Sprintf("posts to %d webhook URL(s); metrics on %s", len(cfg.notifier.URLs), cfg.notifierAddr)
	}
	fmt.Fprintln(out, "starting the pipeline (Postgres, NATS, writer, relay, index and graph projectors)...")
	s, err := startDev(ctx, cfg)
	if err != nil {
		return err
	}
	pgWhere := s.postgresURL
	if s.cluster != nil {
		pgWhere += " (throwaway cluster)"
	}
	fmt.Fprintf(out, `
converge dev is running:
  writer API     %s      (PUT /v1/documents/{key}, POST /v1/documents:batch)
  postgres       %s
  nats           %s
  index          %s (search: converge search "text")
  graph          %s (converge graph KEY)
  notifier       %s
  verify         converge verify -postgres-url '%s'
  rebuild        converge rebuild index -postgres-url '%s'
  data           %s
Ctrl-C stops everything.
`, s.apiURL, pgWhere, s.natsURL, s.cfg.index.Describe(), s.cfg.graph.Describe(), notifies, s.postgresURL, s.postgresURL, s.cfg.dataDir)
	select {
	case <-ctx.Done():
	case <-doneOf(s.group):
	}
	fmt.Fprintln(out, "stopping...")
	return s.stop()
}

func doneOf(g *errgroup.Group) <-chan struct{} {
	ch := make(chan struct{})
	go func() { _ = g.Wait(); close(ch) }()
	return ch
}

// freeAddr returns a free 127.0.0.1 address.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}
