//go:build linux

package chaos

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
)

// adminUser is the suite's own NATS user: it may do anything, and only
// the suite holds it (to read the streams it checks).
const adminUser = "chaos-admin"

// dbName is the database the pipeline runs in.
const dbName = "converge"

// pipeline is everything one run starts: the Postgres cluster, the NATS
// server process, the services, the webhook receiver, and the
// credentials of each.
type pipeline struct {
	t      *testing.T
	bin    *testenv.Binaries
	logDir string

	pg       *pgcluster.Cluster
	adminURL string        // the "postgres" database as the superuser
	dbURL    string        // the pipeline's database as the superuser (the suite's checks)
	db       *pgxpool.Pool // on dbURL

	nats    *testenv.NATSProcess // the server; nil on a cluster
	cluster *testenv.NATSCluster // the cluster (runConfig.cluster); nil on a server
	natsURL string               // what the services connect to
	natsPW  map[string]string    // NATS user -> password
	nc      *nats.Conn           // the suite's admin connection
	js      jetstream.JetStream

	rolePW                      map[string]string // Postgres role -> password
	writeToken, operatorToken   string
	writerTokens, serviceTokens string // tokens files

	api      string // the writer's API
	services []*service
	recv     *receiver
	hookURL  string  // the receiver's URL as the notifiers have it: through their link
	links    links   // every service's link to every server it uses
	clocks   *clocks // every service's wall clock
	// disk holds the NATS server's store (a single server's); nil when
	// this machine cannot mount one, and the disk-full fault is not run.
	disk   *testenv.Disk
	cliLog *os.File
}

func (p *pipeline) service(name string) *service {
	for _, s := range p.services {
		if s.name == name {
			return s
		}
	}
	p.t.Fatalf("no service %s", name)
	return nil
}

// startPipeline starts everything, each service with its own credentials
// alone, and returns once every service is ready and a relay holds the
// slot.
func startPipeline(t *testing.T, cfg runConfig) *pipeline {
	t.Helper()
	ctx := context.Background()
	p := &pipeline{t: t, logDir: cfg.logDir, natsPW: map[string]string{}, rolePW: map[string]string{}}
	if p.logDir == "" {
		p.logDir = t.TempDir()
	} else if err := os.MkdirAll(p.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after the services' clean-up.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of every process: %s", p.logDir)
			for _, s := range p.services {
				if ex := s.exits(); len(ex) > 0 {
					t.Logf("%s exited on its own %d times: %v", s.name, len(ex), ex)
				}
			}
		}
	})
	p.bin = testenv.BuildBinaries(t)
	natsBin := testenv.BuildNATSServer(t)

	// Postgres: a cluster of this run alone, crashed and restarted on
	// its data directory by the faults.
	pg, err := pgcluster.Start(ctx, pgcluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.pg = pg
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pg.Stop(ctx); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	p.adminURL, p.dbURL = pg.URL("postgres"), pg.URL(dbName)
	t.Cleanup(p.links.close)
	p.links.server("postgres", fmt.Sprintf("127.0.0.1:%d", pg.Port()))
	p.clocks = &clocks{dir: t.TempDir()}
	if err := exec1(ctx, p.adminURL, "CREATE DATABASE "+dbName); err != nil {
		t.Fatal(err)
	}
	cliLog, err := os.Create(filepath.Join(p.logDir, "converge-cli.log"))
	if err != nil {
		t.Fatal(err)
	}
	p.cliLog = cliLog
	t.Cleanup(func() { _ = cliLog.Close() })
	for _, r := range roles.Names() {
		p.rolePW[r] = rand.Text()
	}
	rolesEnv := []string{config.EnvPostgresURL + "=" + p.adminURL,
		"CONVERGE_OWNER_PASSWORD=" + p.rolePW[roles.Owner], "CONVERGE_WRITER_PASSWORD=" + p.rolePW[roles.Writer],
		"CONVERGE_RELAY_PASSWORD=" + p.rolePW[roles.Relay], "CONVERGE_READER_PASSWORD=" + p.rolePW[roles.Reader]}
	if out, err := p.converge(ctx, rolesEnv, "roles", "apply", "-database", dbName); err != nil {
		t.Fatalf("converge roles apply: %v\n%s", err, out)
	}
	if err := p.requirePasswords(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := p.converge(ctx, p.postgresEnv(roles.Owner), "migrate", "up"); err != nil {
		t.Fatalf("converge migrate up: %v\n%s", err, out)
	}
	if p.db, err = pgxpool.New(ctx, p.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.db.Close)

	// NATS: a server process with a user per service (the permissions of
	// natsauth), and the suite's own.
	for u := range natsauth.Permissions() {
		p.natsPW[u] = rand.Text()
	}
	users := append(natsauth.Users(p.natsPW), &server.User{Username: adminUser, Password: rand.Text()})
	natsLog, err := os.Create(filepath.Join(p.logDir, "nats-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = natsLog.Close() })
	if cfg.cluster {
		p.cluster = testenv.StartNATSCluster(t, natsBin, 3, testenv.NATSProcessOptions{Users: users, Out: natsLog})
		p.natsURL = p.cluster.URL
	} else {
		o := testenv.NATSProcessOptions{Users: users, Out: natsLog}
		// The store on a disk of its own, which a fault fills.
		if d, err := testenv.MountDisk(t, "512m"); err != nil {
			t.Logf("the NATS server's disk is not filled by any fault: %v", err)
		} else {
			p.disk, o.StoreDir = d, d.Dir
		}
		p.nats = testenv.StartNATSProcess(t, natsBin, o)
		p.natsURL = p.nats.URL
		// A cluster's clients learn every node's address from the
		// servers: their links are not cut.
		p.links.server("nats", hostPort(p.nats.URL))
	}
	p.nc, err = nats.Connect(p.natsURL, nats.UserInfo(adminUser, users[len(users)-1].Password),
		nats.Name("chaos"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.nc.Close)
	if p.js, err = jetstream.New(p.nc); err != nil {
		t.Fatal(err)
	}

	// HTTP: the producers' token, the operator's (verify), and the files
	// of the services that take them.
	p.writeToken, p.operatorToken = rand.Text(), rand.Text()
	p.writerTokens = filepath.Join(t.TempDir(), "writer.tokens")
	p.serviceTokens = filepath.Join(t.TempDir(), "services.tokens")
	for path, text := range map[string]string{
		p.writerTokens:  fmt.Sprintf("client write %s\noperator admin,read %s\n", p.writeToken, p.operatorToken),
		p.serviceTokens: fmt.Sprintf("operator admin,read %s\n", p.operatorToken),
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secret := rand.Text()
	p.recv, err = startReceiver([]byte(secret), cfg.seed, cfg.receiverFailures, cfg.receiverDelay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.recv.close)
	// The webhook's URL is part of each effect's identity: every notifier
	// reaches the receiver through one link, at one URL.
	hook, err := p.links.add("notifier", "receiver", hostPort(p.recv.url))
	if err != nil {
		t.Fatal(err)
	}
	p.hookURL = replaceAddr(p.recv.url, hostPort(p.recv.url), hook.proxy.Addr())

	data := t.TempDir()
	httpAddr := freeAddr(t)
	p.api = "http://" + httpAddr
	relayArgs := []string{"-standby-retry", "200ms"}
	// On a cluster every stream and bucket the services create has three
	// replicas.
	var replicated []string
	if cfg.cluster {
		relayArgs = append(relayArgs, "-replicas", "3")
		replicated = []string{"-replicas", "3"}
	}
	if cfg.history != 0 {
		relayArgs = append(relayArgs, "-stream-history", fmt.Sprint(cfg.history))
	}
	// Effects from a stream that keeps every event, where the relay
	// offers one; a relay without it ignores the variable.
	relayEnv := append(p.postgresEnv(roles.Relay), "CONVERGE_RELAY_EFFECTS=true")
	// Short ack waits and claim timeouts: what a SIGKILLed consumer had in
	// flight comes back within seconds, not minutes.
	p.add("writer", natsauth.UserWriter, p.postgresEnv(roles.Writer), append([]string{"-http-addr", httpAddr, "-tokens-file", p.writerTokens}, replicated...)...)
	p.add("relay-a", natsauth.UserRelay, relayEnv, relayArgs...)
	p.add("relay-b", natsauth.UserRelay, relayEnv, relayArgs...)
	indexArgs := append([]string{"-data-dir", data, "-ack-wait", "5s", "-tokens-file", p.serviceTokens}, replicated...)
	var indexEnv []string
	if q := cfg.qdrant; q != nil {
		indexArgs = append(indexArgs, "-qdrant-url", q.URL, "-qdrant-collection", q.Collection)
		indexEnv = []string{indexprojector.EnvQdrantAPIKey + "=" + q.APIKey}
		p.links.server("qdrant", q.URL)
	}
	p.add("projector-index", natsauth.UserIndex, indexEnv, indexArgs...)
	notifierArgs := []string{"-webhook-urls", p.hookURL, "-claim-timeout", "10s", "-http-timeout", "5s",
		"-retry-min", "200ms", "-retry-max", "2s", "-tokens-file", p.serviceTokens}
	notifierEnv := []string{"CONVERGE_WEBHOOK_SECRET=" + secret}
	switch {
	case cfg.partitions > 0:
		// Three instances of the graph projector on Neo4j, started
		// without partitions (one writes, two stand by): the test moves
		// them to partitions (moveToPartitions).
		p.links.server("neo4j", hostPort(cfg.neo4j.URL))
		graphEnv := []string{"CONVERGE_NEO4J_URL=" + cfg.neo4j.URL, "CONVERGE_NEO4J_USER=" + cfg.neo4j.User, "CONVERGE_NEO4J_PASSWORD=" + cfg.neo4j.Password}
		graphArgs := []string{"-lease-ttl", standbyTTL.String(), "-neo4j-tx-timeout", "3s", "-tokens-file", p.serviceTokens}
		for _, name := range []string{"projector-graph", "projector-graph-b", "projector-graph-c"} {
			p.add(name, natsauth.UserGraph, graphEnv, graphArgs...)
		}
		p.add("notifier", natsauth.UserNotifier, notifierEnv, append(append(notifierArgs, "-ack-wait", "5s"), replicated...)...)
	case cfg.standby:
		// The stores shared by two instances: Neo4j, the notifier's
		// bucket. The ack wait stays at its default: a takeover does not
		// wait for it.
		p.links.server("neo4j", hostPort(cfg.neo4j.URL))
		graphEnv := []string{"CONVERGE_NEO4J_URL=" + cfg.neo4j.URL, "CONVERGE_NEO4J_USER=" + cfg.neo4j.User, "CONVERGE_NEO4J_PASSWORD=" + cfg.neo4j.Password}
		graphArgs := []string{"-lease-ttl", standbyTTL.String(), "-neo4j-tx-timeout", "3s", "-tokens-file", p.serviceTokens}
		p.add("projector-graph", natsauth.UserGraph, graphEnv, graphArgs...)
		p.add("projector-graph-b", natsauth.UserGraph, graphEnv, graphArgs...)
		notifierArgs = append(notifierArgs, "-lease-ttl", standbyTTL.String())
		p.add("notifier", natsauth.UserNotifier, notifierEnv, notifierArgs...)
		p.add("notifier-b", natsauth.UserNotifier, notifierEnv, notifierArgs...)
	default:
		p.add("projector-graph", natsauth.UserGraph, nil, append([]string{"-data-dir", data, "-ack-wait", "5s", "-tokens-file", p.serviceTokens}, replicated...)...)
		p.add("notifier", natsauth.UserNotifier, notifierEnv, append(append(notifierArgs, "-ack-wait", "5s"), replicated...)...)
	}
	t.Cleanup(func() {
		for _, s := range p.services {
			s.resume()
			s.kill()
		}
	})
	for _, s := range p.services {
		s.start()
	}
	for _, s := range p.services {
		testenv.Eventually(t, s.name+" to be ready", 90*time.Second, s.ready)
	}
	testenv.Eventually(t, "a relay to hold the slot", 60*time.Second, func() bool { return p.activeRelay() != nil })
	return p
}

// add declares a service: the binary of its name (relay-a and relay-b
// run the relay), connecting to NATS as natsUser with its password in the
// environment, never on the command line.
func (p *pipeline) add(name, natsUser string, env []string, args ...string) {
	bin := strings.TrimSuffix(strings.TrimSuffix(name, "-b"), "-c")
	if strings.HasPrefix(name, "relay") {
		bin = "relay"
	}
	log, err := os.OpenFile(filepath.Join(p.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = log.Close() })
	addr := freeAddr(p.t)
	args = append(append([]string{}, args...), "-metrics-addr", addr, "-nats-url", p.natsURL, "-nats-user", natsUser)
	env = append(append([]string{}, env...), natsauth.EnvPassword+"="+p.natsPW[natsUser], envFaultClockFile+"="+p.clocks.file(name))
	if err := p.links.route(name, args, env); err != nil {
		p.t.Fatal(err)
	}
	p.services = append(p.services, &service{t: p.t, name: name, bin: p.bin.Path(bin), args: args, env: env, addr: addr, log: log})
}

// activeRelay is the relay that holds the slot, nil when none does.
func (p *pipeline) activeRelay() *service {
	for _, s := range p.services {
		if strings.HasPrefix(s.name, "relay") && s.metric("converge_relay_active") == "1" {
			return s
		}
	}
	return nil
}

func (p *pipeline) postgresEnv(role string) []string {
	u, err := roles.URL(p.dbURL, role, p.rolePW[role])
	if err != nil {
		p.t.Fatal(err)
	}
	return []string{config.EnvPostgresURL + "=" + u}
}

// operatorEnv is what the operator's commands run with: the reader's
// Postgres URL, the operator's token and NATS user.
func (p *pipeline) operatorEnv() []string {
	return append(p.postgresEnv(roles.Reader), auth.EnvToken+"="+p.operatorToken,
		natsauth.EnvPassword+"="+p.natsPW[natsauth.UserOperator])
}

// converge runs the converge CLI with env (its credentials) added to the
// test's environment without its credentials, and returns its output.
func (p *pipeline) converge(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, p.bin.Path("converge"), args...)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(credentialVars, name) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(p.cliLog, "=== %s $ converge %s (%v)\n%s", time.Now().Format("15:04:05.000"), strings.Join(args, " "), err, out)
	return string(out), err
}

// requirePasswords makes the cluster ask converge's roles for their
// passwords (scram-sha-256) on TCP: a service holding another's password,
// or none, is refused. The superuser, the suite's own access, stays
// trusted.
func (p *pipeline) requirePasswords(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var path string
	if err := conn.QueryRow(ctx, "SHOW hba_file").Scan(&path); err != nil {
		return err
	}
	before, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	rule := "host all " + strings.Join(roles.Names(), ",") + " 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(path, append([]byte(rule), before...), 0o600); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

func exec1(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := stack.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
