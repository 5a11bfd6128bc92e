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
//
// NATS and the HTTP APIs are secured as a deployment secures them. The
// embedded NATS server admits only the users of internal/natsauth, each
// with a random password made for this stack, and each service connects
// as its own user (the writer as writer, the relay as relay, the
// projectors and the notifier as theirs); the stack's own connection, which
// ensures the documents' stream before the relay starts, is the relay's.
// With a given NATS URL the services connect without credentials: that
// server's operator decides who may do what. A tokens file in the data
// directory (0600) holds two random tokens, operator (admin, read) and
// writer-client (write); the writer and both projectors accept them, and
// the operator's token, its NATS password and the writer-client's token
// are in files of their own there, for the CLI (CONVERGE_TOKEN_FILE,
// CONVERGE_NATS_PASSWORD_FILE) and a producer.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/proc"
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
	// Each service's settings are read as its binary reads them (its
	// flags, from the environment and the configuration file), with the
	// stack's connections, addresses and credentials given as flags; Index
	// and Graph, when set, replace the stores' settings so read (a test's
	// stores).
	Index *indexprojector.Config
	Graph *graphprojector.Config
	// ConfigFile is the deployment's configuration file (-config); empty:
	// the one CONVERGE_CONFIG names, if any.
	ConfigFile string
	// GraphChild runs the graph projector as a child process
	// (GraphChildPath, default this binary, with the arguments
	// `projector-graph ...`), so that it can be killed; GraphAddrPicked:
	// GraphAddr was picked free by the caller, and may be picked again
	// should another process take it before the child binds it.
	GraphChild, GraphAddrPicked bool
	GraphChildPath              string
	// Notifier, when set, runs the webhook notifier too with these
	// settings, its metrics on NotifierAddr; it runs too, with the settings
	// its binary would read, when the environment or the configuration file
	// names webhook URLs. Once started, it is the notifier's settings (nil:
	// none runs).
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
	// read-only role of verify and status; and the producers' role, which
	// hands documents over in its own transactions (converge_inbox).
	OwnerURL, WriterURL, RelayURL, ReaderURL, ProducerURL string

	// TokensFile (in the data directory, 0600) holds the bearer tokens
	// the writer and both projectors accept: OperatorToken (scopes admin
	// and read: verify, rebuild, search, graph, re-emission) and
	// WriterToken (scope write: the documents' routes). Each token is also
	// alone in a file of its own, OperatorTokenFile and WriterTokenFile
	// (CONVERGE_TOKEN_FILE of the CLI). Never print the tokens.
	TokensFile                         string
	OperatorToken, WriterToken         string
	OperatorTokenFile, WriterTokenFile string
	// OperatorNATS is the operator's user on the embedded NATS server
	// (converge status, replay, dlq), its password also in
	// OperatorNATSPasswordFile (0600, CONVERGE_NATS_PASSWORD_FILE); both
	// zero with a given NATS URL.
	OperatorNATS             natsauth.ClientConfig
	OperatorNATSPasswordFile string
	// ReaderURLFile (0600) holds ReaderURL, the operator's read-only
	// Postgres URL with its password, for CONVERGE_POSTGRES_URL_FILE.
	ReaderURLFile string
	natsPasswords map[string]string // by user; nil with a given NATS URL

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
	if _, err := schema.EnsureSlot(ctx, s.RelayURL, relay.DefaultSlot); err != nil {
		return nil, err
	}

	if err := s.writeTokens(); err != nil {
		return nil, err
	}

	s.NATSURL = cfg.NATSURL
	if s.NATSURL == "" {
		if err := s.makeNATSUsers(); err != nil {
			return nil, err
		}
		if s.NATS, err = natsserver.StartWith(natsserver.Options{StoreDir: filepath.Join(dir, "nats"), Port: -1,
			Users: natsauth.Users(s.natsPasswords)}); err != nil {
			return nil, fmt.Errorf("start NATS: %w", err)
		}
		s.NATSURL = s.NATS.URL
	}
	if cfg.InfraOnly {
		return s, nil
	}
	svc, err := s.settings()
	if err != nil {
		return nil, err
	}
	if slot := svc.relay.Relay.Slot; slot != relay.DefaultSlot {
		// A slot of the relay's settings (CONVERGE_RELAY_SLOT, the
		// configuration file), made before the first write as the
		// default one was.
		if _, err := schema.EnsureSlot(ctx, s.RelayURL, slot); err != nil {
			return nil, err
		}
	}

	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	g, runCtx := errgroup.WithContext(runCtx)
	s.group = g

	listening := make(chan net.Addr, 1)
	g.Go(func() error {
		c := svc.writer
		c.OnListen = func(a net.Addr) { listening <- a }
		return service.Run(runCtx, c, cfg.Log.With("service", "writer"), writer.Run)
	})
	// The relay ensures the stream too; doing it here first spares the
	// projectors a retry when they start before it.
	if err := ensureStream(ctx, s.NATSURL, svc.relay.NATSAuth, svc.relay.Relay.Stream); err != nil {
		return nil, err
	}
	relays := make(chan *relay.Relay, 1)
	g.Go(func() error {
		c := svc.relay
		c.OnStart = func(r *relay.Relay) { relays <- r }
		return service.Run(runCtx, c, cfg.Log.With("service", "relay"), relay.Run)
	})
	g.Go(func() error {
		return service.Run(runCtx, svc.index, cfg.Log.With("service", "projector-index"), indexprojector.Run)
	})
	if cfg.GraphChild {
		if err := s.StartGraphChild(ctx); err != nil {
			return nil, err
		}
	} else {
		g.Go(func() error {
			return service.Run(runCtx, svc.graph, cfg.Log.With("service", "projector-graph"), graphprojector.Run)
		})
	}
	if svc.notifier != nil {
		g.Go(func() error {
			return service.Run(runCtx, *svc.notifier, cfg.Log.With("service", "notifier"), notifier.Run)
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

// services are the settings of the services a stack runs.
type services struct {
	writer   writer.ServiceConfig
	relay    relay.ServiceConfig
	index    indexprojector.ServiceConfig
	graph    graphprojector.ServiceConfig
	notifier *notifier.ServiceConfig // nil: no notifier
}

// settings reads each service's settings as its binary does, from its
// flags: the stack's connections, addresses, data directory, tokens and
// NATS user as command-line flags, the rest from the environment and the
// configuration file. It sets Config.Index, Graph and Notifier to the
// settings in use.
func (s *Stack) settings() (svc services, err error) {
	cfg := s.Config
	dir := cfg.DataDir
	if svc.writer, err = parse(s, "writer", natsauth.UserWriter, writer.Flags, nil,
		"-postgres-url", s.WriterURL, "-nats-url", s.NATSURL, "-http-addr", cfg.HTTPAddr,
		"-metrics-addr", cfg.WriterAddr, "-tokens-file", s.TokensFile); err != nil {
		return svc, err
	}
	notify, err := s.notifierSettings()
	if err != nil {
		return svc, err
	}
	// The relay's collector settings are the process's: a stack shares
	// its process with the caller, whose collector is not the relay's to
	// tune (0 leaves it alone).
	if svc.relay, err = parse(s, "relay", natsauth.UserRelay, relay.Flags, nil,
		"-postgres-url", s.RelayURL, "-nats-url", s.NATSURL, "-metrics-addr", cfg.RelayAddr,
		"-effects="+strconv.FormatBool(notify != nil), "-gogc", "0", "-memory-limit-mib", "0"); err != nil {
		return svc, err
	}
	projectorArgs := func(addr string) []string {
		return []string{"-nats-url", s.NATSURL, "-metrics-addr", addr, "-tokens-file", s.TokensFile, "-data-dir", dir}
	}
	if svc.index, err = parse(s, "projector-index", natsauth.UserIndex, indexprojector.ServiceFlags, nil, projectorArgs(cfg.IndexAddr)...); err != nil {
		return svc, err
	}
	if cfg.Index != nil {
		svc.index.Store = *cfg.Index
		svc.index.Store.DataDir = dir
	}
	if svc.graph, err = parse(s, "projector-graph", natsauth.UserGraph, graphprojector.ServiceFlags, nil, projectorArgs(cfg.GraphAddr)...); err != nil {
		return svc, err
	}
	if cfg.Graph != nil {
		svc.graph.Store = *cfg.Graph
		svc.graph.Store.DataDir = dir
	}
	s.Config.Index, s.Config.Graph = &svc.index.Store, &svc.graph.Store
	if notify != nil {
		c, err := parse(s, "notifier", natsauth.UserNotifier, notifier.ServiceFlags, notify,
			"-nats-url", s.NATSURL, "-metrics-addr", cfg.NotifierAddr)
		if err != nil {
			return svc, err
		}
		if cfg.Notifier != nil {
			c.Notifier = *cfg.Notifier
		}
		svc.notifier, s.Config.Notifier = &c, &c.Notifier
	}
	return svc, nil
}

// notifierSettings is nil when no notifier runs, else the variables that
// give the notifier its webhooks: none when the environment or the
// configuration file does, or Config.Notifier's.
func (s *Stack) notifierSettings() (map[string]string, error) {
	if n := s.Config.Notifier; n != nil {
		// Placeholders that let its flags parse; Config.Notifier replaces
		// what they make.
		return map[string]string{notifier.EnvWebhookURLs: strings.Join(n.URLs, ","), notifier.EnvWebhookSecret: "given"}, nil
	}
	f, _, _ := service.Bind("notifier", s.environ(natsauth.UserNotifier, nil), notifier.ServiceFlags)
	var args []string
	if s.Config.ConfigFile != "" {
		args = []string{"-config", s.Config.ConfigFile}
	}
	if err := f.Parse(args); err != nil {
		return nil, fmt.Errorf("the notifier's settings: %w", err)
	}
	if strings.TrimSpace(f.Lookup("webhook-urls").Value.String()) == "" {
		return nil, nil
	}
	return map[string]string{}, nil
}

// parse is the settings of service name (see [service.Parse]) for args,
// with its NATS user's credentials and the configuration file, reading
// s.environ(user, vars).
func parse[C service.Config](s *Stack, name, user string, bind func(*config.Flags) func() (C, error), vars map[string]string, args ...string) (C, error) {
	if na := s.NATSAuth(user); na.User != "" {
		args = append(args, "-nats-user", na.User)
	}
	if s.Config.ConfigFile != "" {
		args = append(args, "-config", s.Config.ConfigFile)
	}
	c, _, err := service.Parse(name, s.environ(user, vars), args, bind)
	if err != nil {
		return c, fmt.Errorf("the %s's settings: %w", name, err)
	}
	return c, nil
}

// environ is the environment a service the stack runs reads: this
// process's, without the credentials that are not the service's own
// (childUnset: dev's Postgres URL, the operator's NATS user and token),
// with its NATS user's password, and vars.
func (s *Stack) environ(user string, vars map[string]string) config.Environ {
	pw := s.natsPasswords[user]
	return func(key string) (string, bool) {
		if v, ok := vars[key]; ok {
			return v, true
		}
		if key == natsauth.EnvPassword && pw != "" {
			return pw, true
		}
		if slices.Contains(childUnset, key) {
			return "", false
		}
		return os.LookupEnv(key)
	}
}

// NATSAuth is the credentials of user (a natsauth user name) on the
// embedded NATS server: what a service started by the caller connects
// with (InfraOnly). Zero with a given NATS URL, or for a user the server
// does not know.
func (s *Stack) NATSAuth(user string) natsauth.ClientConfig {
	pw := s.natsPasswords[user]
	if pw == "" {
		return natsauth.ClientConfig{}
	}
	return natsauth.ClientConfig{User: user, Password: pw}
}

// makeNATSUsers makes a random password for every user of natsauth, and
// writes the operator's to a file of the data directory.
func (s *Stack) makeNATSUsers() error {
	s.natsPasswords = map[string]string{}
	for name := range natsauth.Permissions() {
		s.natsPasswords[name] = rand.Text()
	}
	s.OperatorNATS = s.NATSAuth(natsauth.UserOperator)
	s.OperatorNATSPasswordFile = filepath.Join(s.Config.DataDir, "operator.nats-password")
	return writeSecret(s.OperatorNATSPasswordFile, s.OperatorNATS.Password)
}

// writeTokens writes the tokens file with a new random token for the
// operator and one for the writer's clients, and each token alone in a
// file of its own.
func (s *Stack) writeTokens() error {
	dir := s.Config.DataDir
	s.OperatorToken, s.WriterToken = rand.Text(), rand.Text() // 26 characters, more than auth.MinTokenBytes
	s.TokensFile = filepath.Join(dir, "tokens")
	s.OperatorTokenFile = filepath.Join(dir, "operator.token")
	s.WriterTokenFile = filepath.Join(dir, "writer-client.token")
	lines := fmt.Sprintf("# the tokens of this stack's writer and projectors: name scopes token\n"+
		"operator %s %s\nwriter-client %s %s\n", auth.Admin|auth.Read, s.OperatorToken, auth.Write, s.WriterToken)
	for _, f := range []struct{ path, text string }{
		{s.TokensFile, lines}, {s.OperatorTokenFile, s.OperatorToken + "\n"}, {s.WriterTokenFile, s.WriterToken + "\n"},
	} {
		if err := writeSecret(f.path, f.text); err != nil {
			return err
		}
	}
	return nil
}

// writeSecret writes text to path, readable by its owner alone (a file
// left by an earlier run is replaced, and its mode set again).
func writeSecret(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// ensureStream creates the stream unless it exists, connected as
// credentials say (the relay's: the stream is its to create), with the
// relay's settings.
func ensureStream(ctx context.Context, natsURL string, credentials natsauth.ClientConfig, stream relay.StreamConfig) error {
	opts, err := credentials.Options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL, append(opts, nats.Name("converge-dev"))...)
	if err != nil {
		return fmt.Errorf("connect NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := relay.EnsureStream(ctx, js, stream); err != nil {
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
	urls := map[string]*string{roles.Owner: &s.OwnerURL, roles.Writer: &s.WriterURL, roles.Relay: &s.RelayURL, roles.Reader: &s.ReaderURL,
		roles.Producer: &s.ProducerURL}
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
	s.ReaderURLFile = filepath.Join(s.Config.DataDir, "reader.postgres-url")
	return writeSecret(s.ReaderURLFile, s.ReaderURL)
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
		args := []string{"projector-graph", "-nats-url", s.NATSURL, "-data-dir", s.Config.DataDir,
			"-metrics-addr", addr, "-log-level", "warn", "-ack-wait", "5s", "-tokens-file", s.TokensFile}
		if s.Config.ConfigFile != "" {
			args = append(args, "-config", s.Config.ConfigFile)
		}
		var env []string
		if na := s.NATSAuth(natsauth.UserGraph); na.User != "" {
			// The password in the environment alone: a flag's value is
			// in the process list.
			args = append(args, "-nats-user", na.User)
			env = append(env, natsauth.EnvPassword+"="+na.Password)
		}
		c, err := proc.Start(exe, args,
			// A projector holds no Postgres credentials, and refuses to
			// start with them: dev's own are not passed on, nor the
			// operator's NATS credentials and token a caller may have set.
			proc.Options{Out: s.Config.LogOut, Env: env, Unset: childUnset})
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

// childUnset are variables of this process's environment the graph
// projector child does not get: credentials that are not its own.
var childUnset = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE",
	natsauth.EnvCreds, natsauth.EnvCreds + "_FILE", natsauth.EnvNKey, natsauth.EnvNKey + "_FILE",
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
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

// FreeAddr returns a free 127.0.0.1 address for a service to listen on
// later (see [localaddr.Free]).
func FreeAddr() (string, error) { return localaddr.Free() }

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
