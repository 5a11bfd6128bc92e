//go:build linux

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// process is one of the real binaries, run as a child process.
type process struct {
	t    *testing.T
	name string
	bin  string
	args []string
	env  []string // added to the test's environment
	// addr is its metrics address as the test and the CLI reach it:
	// host:port (plain HTTP), or https://host:port in a run with TLS.
	addr string
	logs testenv.Buffer

	mu    sync.Mutex
	child *proc.Child // nil while not running
}

func (s *process) start() {
	s.t.Helper()
	// Its own credentials alone: none of the test's environment.
	c, err := proc.Start(s.bin, s.args, proc.Options{Env: s.env, Unset: credentialVars, Out: &s.logs})
	if err != nil {
		s.t.Fatalf("start %s: %v", s.name, err)
	}
	s.mu.Lock()
	s.child = c
	s.mu.Unlock()
}

func (s *process) take() *proc.Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.child
	s.child = nil
	return c
}

// kill SIGKILLs the process and reaps it.
func (s *process) kill() {
	if c := s.take(); c != nil {
		c.Kill()
	}
}

// stop asks the process to stop (SIGTERM) and waits for a clean exit.
func (s *process) stop() {
	s.t.Helper()
	if c := s.take(); c != nil {
		if err := c.Stop(time.Minute); err != nil {
			s.t.Errorf("%s after SIGTERM: %v", s.name, err)
		}
	}
}

// ready reports whether its /readyz answers 200.
func (s *process) ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, serviceURL(s.addr)+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := serviceClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := stack.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// serviceURL is the base URL of a service's listener at addr: host:port
// is plain HTTP; an http:// or https:// URL is taken as it is.
func serviceURL(addr string) string {
	if strings.Contains(addr, "://") {
		return addr
	}
	return "http://" + addr
}

// serviceClient is the test's client of the services' HTTP listeners:
// plain HTTP, and HTTPS to a listener whose certificate the CA of a run
// going on signed (trustCA). The services of a run all listen on
// 127.0.0.1, the name their certificate is checked for.
var serviceClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
	MinVersion: tls.VersionTLS12,
	// The certificate is verified by verifyRunCA, against each run's CA
	// (they come and go with the runs), not skipped.
	InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
	VerifyConnection:   verifyRunCA,
}}}

// runCAs are the CAs of the runs with TLS going on.
var runCAs struct {
	mu    sync.Mutex
	pools []*x509.CertPool
}

// trustCA makes serviceClient trust certs' CA until t ends.
func trustCA(t *testing.T, certs testenv.Certificates) {
	runCAs.mu.Lock()
	runCAs.pools = append(runCAs.pools, certs.Pool)
	runCAs.mu.Unlock()
	t.Cleanup(func() {
		runCAs.mu.Lock()
		defer runCAs.mu.Unlock()
		runCAs.pools = slices.DeleteFunc(runCAs.pools, func(p *x509.CertPool) bool { return p == certs.Pool })
		serviceClient.CloseIdleConnections()
	})
}

// verifyRunCA accepts a server certificate that one of runCAs signed for
// 127.0.0.1 (or the name the client asked for).
func verifyRunCA(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no server certificate")
	}
	// A client sends no server name for an IP address.
	name := cs.ServerName
	if name == "" {
		name = "127.0.0.1"
	}
	opts := x509.VerifyOptions{DNSName: name, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	runCAs.mu.Lock()
	pools := slices.Clone(runCAs.pools)
	runCAs.mu.Unlock()
	err := errors.New("no run with TLS is going on: no CA is trusted")
	for _, pool := range pools {
		opts.Roots = pool
		if _, err = cs.PeerCertificates[0].Verify(opts); err == nil {
			return nil
		}
	}
	return err
}

// TestBinariesSurviveKillsAndVerify runs the real binaries as separate
// processes (writer, relay, both projectors; Postgres and NATS are the test's
// own), SIGKILLs each service once while documents are written, replays
// the index projector, rebuilds the graph while documents change
// (SIGKILLing its projector during the rebuild), and checks with `converge
// verify` (the binary) that every store agrees; then it damages the index
// and the graph behind the projectors' backs, checks that verify names
// exactly those documents, and that `verify --repair` repairs them. It runs
// twice. First with both projectors on the embedded stores (the graph
// rebuilt blue/green), over plain connections. Then with TLS on every
// listener and every link, the graph on the real Neo4j server (rebuilt in
// place) and the index in a collection of a real Qdrant server that takes
// an API key, where the index is also rebuilt blue/green three times in a
// row (its projector SIGKILLed during one, documents changing during
// another), its points are damaged through Qdrant's HTTP API, and
// projector-index refuses to start with the read-only key, no key or a
// wrong one; that run also checks that each link is TLS indeed
// (checkLinksAreTLS). Each process runs with its own credentials alone,
// the binaries refuse what those do not allow (checkDenials), the
// producer's NATS user reads none of the others' inboxes throughout
// (inboxSpy), and no secret of the run appears in any output, command line
// or /metrics.
func TestBinariesSurviveKillsAndVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs every binary")
	}
	bin := testenv.BuildBinaries(t)
	t.Run("embedded-graph", func(t *testing.T) { testBinaries(t, bin, binaryStores{}) })
	t.Run("tls", func(t *testing.T) {
		certs := testenv.NewCertificates(t)
		n := testenv.LeaseNeo4j(t)
		q := testenv.StartQdrantTLS(t, certs)
		testBinaries(t, bin, binaryStores{certs: &certs, neo4j: &n, qdrant: &q})
	})
}

// binaryStores are the stores of a run of the binaries beside the
// embedded ones: the graph in Neo4j, the index in a Qdrant collection
// (with an API key, over TLS); and certs, the CA and key pair of a run
// with TLS on every listener and every link.
type binaryStores struct {
	certs  *testenv.Certificates
	neo4j  *testenv.Neo4j
	qdrant *testenv.QdrantTLS
}

// testBinaries is TestBinariesSurviveKillsAndVerify with the graph in
// st.neo4j and the index in st.qdrant, each embedded when nil, and TLS
// everywhere with st.certs. Every process holds its own
// credentials alone, passwords and tokens in its environment (never on its
// command line): the roles are applied on an empty database by `converge
// roles apply`, which `converge migrate up` migrates as converge_owner; the
// writer logs in as converge_writer, the relay as converge_relay, verify
// and status as converge_reader, and the cluster checks their passwords;
// NATS admits the natsauth users alone, each service as its own; the
// writer and the projectors take tokens files, the CLI the operator's
// token; projector-index the Qdrant API key. At the end no secret of the
// run may be in any output.
//
// With TLS, the services serve HTTPS alone (-tls-cert, -tls-key), their
// clients and the CLI trust the run's CA alone (-nats-ca, CONVERGE_TLS_CA,
// sslmode=verify-full with sslrootcert, -qdrant-ca), Postgres refuses
// converge's roles without TLS, and NATS and Qdrant accept TLS alone.
// projector-graph reaches the test Neo4j server itself over TLS
// (bolt+s://), trusting the server's own CA alone (-neo4j-ca); that
// server offers plain Bolt too, on the same port, for the other tests.
func testBinaries(t *testing.T, bin *testenv.Binaries, st binaryStores) {
	n, q, certs := st.neo4j, st.qdrant, st.certs
	dbURL := pg.NewDatabase(t)
	creds := newCredentials(t, dbURL, certs)
	adminURL := creds.postgresURL(pg.Cluster.URL("postgres"))
	if certs != nil {
		pg.EnableTLS(t, *certs)
		trustCA(t, *certs)
	}
	if n != nil {
		creds.secrets["neo4j password"] = n.Password
	}
	if q != nil {
		creds.secrets["qdrant API key"] = q.APIKey
		creds.secrets["qdrant read-only API key"] = q.ReadOnlyKey
	}
	requirePasswords(t, pg.Cluster.URL("postgres"), certs != nil)
	nats := creds.startNATS(t)
	data := t.TempDir()
	cmd := &cli{t: t, path: bin.Path("converge"), env: creds.cliEnv()}
	owner, reader := creds.postgresEnv(t, roles.Owner), creds.postgresEnv(t, roles.Reader)
	dbName := strings.TrimPrefix(mustParseURL(t, dbURL).Path, "/")
	if out, err := cmd.run(append([]string{config.EnvPostgresURL + "=" + adminURL}, creds.rolesEnv()...),
		"roles", "apply", "-database", dbName); err != nil {
		t.Fatalf("converge roles apply: %v\n%s", err, out)
	}
	if out, err := cmd.run(owner, "migrate", "up"); err != nil {
		t.Fatalf("converge migrate up (as %s): %v\n%s", roles.Owner, err, out)
	}
	t.Cleanup(func() {
		// The slot must go before the database can be dropped.
		_, _ = cmd.run(reader, "status") // (keeps the binary exercised)
		dropSlots(t, dbURL)
	})

	// projector-index's Qdrant client trusts the run's CA alone, given
	// as -qdrant-ca (and to checkDenials' children as its variable).
	var qdrantCA, driversCA []string
	if certs != nil {
		qdrantCA = []string{"-qdrant-ca", certs.CAFile}
		driversCA = []string{indexprojector.EnvQdrantCA + "=" + certs.CAFile}
	}
	httpAddr := freePort(t)
	svc := func(name, listen, natsUser string, env []string, args ...string) *process {
		args = append(append(append(args, "-nats-url", nats.URL), creds.natsArgs(natsUser)...), creds.httpArgs()...)
		return &process{t: t, name: name, bin: bin.Path(name), args: args, addr: creds.serviceAddr(listen),
			env: append(creds.natsEnv(natsUser), env...)}
	}
	wAddr, rAddr, iAddr, gAddr := freePort(t), freePort(t), freePort(t), freePort(t)
	services := []*process{
		svc("writer", wAddr, natsauth.UserWriter, creds.postgresEnv(t, roles.Writer),
			"-http-addr", httpAddr, "-metrics-addr", wAddr, "-tokens-file", creds.writerTokens),
		svc("relay", rAddr, natsauth.UserRelay, creds.postgresEnv(t, roles.Relay),
			"-metrics-addr", rAddr, "-standby-retry", "200ms"),
		// A short ack wait: what a SIGKILLed projector had in flight is
		// delivered again after it, not after the default minute.
		svc("projector-index", iAddr, natsauth.UserIndex, nil, append(qdrantCA,
			"-data-dir", data, "-metrics-addr", iAddr, "-ack-wait", "5s", "-tokens-file", creds.projectorTokens)...),
		svc("projector-graph", gAddr, natsauth.UserGraph, nil,
			"-data-dir", data, "-metrics-addr", gAddr, "-ack-wait", "5s", "-tokens-file", creds.projectorTokens),
	}
	graphURL, graphTLS := "", (*tls.Config)(nil)
	if n != nil {
		graphURL = n.URL
		g := services[3]
		if certs != nil {
			// The server's own TLS, verified against its own CA (the
			// script made it, not this run).
			graphURL, graphTLS = n.TLSURL(), n.ClientTLS(t)
			g.args = append(g.args, "-neo4j-ca", n.CA)
		}
		// The password through the environment: never on a command line.
		g.args = append(g.args, "-neo4j-url", graphURL, "-neo4j-user", n.User)
		g.env = append(g.env, "CONVERGE_NEO4J_PASSWORD="+n.Password)
	}
	if q != nil {
		// The key through the environment too.
		x := services[2]
		x.args = append(x.args, "-qdrant-url", q.TLSURL, "-qdrant-collection", q.Collection)
		x.env = append(x.env, indexprojector.EnvQdrantAPIKey+"="+q.APIKey)
	}
	t.Cleanup(func() {
		for _, s := range services {
			s.kill()
			if t.Failed() {
				t.Logf("--- %s output (tail) ---\n%s", s.name, lastBytes(s.logs.String(), 3000))
			}
		}
		if t.Failed() {
			t.Logf("--- converge commands (tail) ---\n%s", lastBytes(cmd.logs.String(), 3000))
		}
	})
	for _, s := range services {
		s.start()
	}
	for _, s := range services {
		testenv.Eventually(t, s.name+" to be ready", 60*time.Second, s.ready)
	}
	relay := services[1]
	relayActive := func() bool {
		resp, err := serviceClient.Get(serviceURL(relay.addr) + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "converge_relay_active 1" {
				return true
			}
		}
		return false
	}
	testenv.Eventually(t, "the relay to hold its slot", 30*time.Second, relayActive)

	api := serviceURL(creds.serviceAddr(httpAddr))
	ix, gx := services[2], services[3]
	refusals := checkDenials(t, denialRun{bin: bin, cli: cmd, creds: creds, natsURL: nats.URL, api: api, indexAddr: ix.addr,
		qdrant: q, driversCA: driversCA})

	// The operator's credentials: the reader's URL, the operator's token
	// (verify reads the projectors, rebuild and --repair are admin's), and
	// its NATS user (replay, status).
	opEnv := append(append([]string{}, reader...), auth.EnvToken+"="+creds.operator)
	opNATS := append(creds.natsArgs(natsauth.UserOperator), "-nats-url", nats.URL)
	opNATSEnv := append(append([]string{}, reader...), creds.natsEnv(natsauth.UserOperator)...)

	// From here to the end, the producer listens on every inbox but its
	// own: it must read none of the deliveries, replies and key-value
	// answers of the others (checked after the repair).
	spy := spyOnInboxes(t, nats.URL, natsauth.UserProducer, creds.nats[natsauth.UserProducer], creds.certs)

	// Write 400 documents in batches while each service is SIGKILLed once
	// at a random point and restarted.
	docs := documents(400)
	written := make(chan error, 1)
	go func() {
		for lo := 0; lo < len(docs); lo += 20 {
			if err := postRetrying(api, creds.write, docs[lo:min(lo+20, len(docs))], 30*time.Second); err != nil {
				written <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		written <- nil
	}()
	for _, s := range services {
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		s.kill()
		s.start()
		testenv.Eventually(t, s.name+" to be ready again", 60*time.Second, s.ready)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}

	verifyArgs := []string{"verify", "--json", "-index-addr", ix.addr, "-graph-addr", gx.addr}
	agrees := func() bool {
		_, err := cmd.run(opEnv, verifyArgs...)
		return err == nil
	}
	testenv.Eventually(t, "converge verify to exit 0 after the kills", 90*time.Second, agrees)
	var links []string
	if certs != nil {
		links = checkLinksAreTLS(t, tlsRun{creds: creds, nats: nats, services: services, apiListen: httpAddr,
			graphURL: graphURL, neo4j: *n, qdrant: *q})
	}

	// Replay the index projector from the start, and rebuild the graph
	// from scratch, SIGKILLing its projector in the middle of the rebuild:
	// the restarted projector resumes it, and converge rebuild (which
	// keeps polling through the restart) reports it done and verified.
	if out, err := cmd.run(opNATSEnv, append([]string{"replay", "index", "--from-seq", "1"}, opNATS...)...); err != nil {
		t.Fatalf("converge replay index: %v\n%s", err, out)
	}
	graphRebuild := startRebuild(t, cmd, opEnv, "graph", gx.addr)
	// Live traffic during the rebuild: a second version of 100 documents
	// (new titles, links and tags).
	changed := changeDocuments(api, creds.write, 2, 0, 100)
	testenv.Eventually(t, "the graph rebuild to start", 30*time.Second, rebuildStarted(gx.addr, creds.operator, ""))
	killedDuringRebuild := rebuildStatus(gx.addr, creds.operator).Phase != rebuild.PhaseDone
	gx.kill()
	gx.start()
	testenv.Eventually(t, "projector-graph to be ready after the kill", 60*time.Second, gx.ready)
	rebuilt, agreed := graphRebuild.result(t, 120*time.Second)
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if rebuilt.Phase != rebuild.PhaseDone || !agreed || rebuilt.InPlace != (n != nil) {
		t.Fatalf("converge rebuild graph (want in place: %v): %s", n != nil, graphRebuild.out.String())
	}
	graphDirs := rebuild.Dirs{Root: data, Base: "graph"}
	if live, err := graphDirs.Live(); n == nil && (err != nil || live == "graph") {
		t.Fatalf("live graph generation after the rebuild: %q, %v; want a fresh one", live, err)
	}
	testenv.Eventually(t, "converge verify to exit 0 after the replays", 90*time.Second, agrees)
	if out, err := cmd.run(opNATSEnv, append([]string{"status"}, opNATS...)...); err != nil || !strings.Contains(out, "CONSUMER") {
		t.Fatalf("converge status: %v\n%s", err, out)
	}
	rebuilds := []*backgroundRebuild{graphRebuild}
	if q != nil {
		rebuilds = append(rebuilds, rebuildQdrantIndex(t, qdrantRebuilds{cli: cmd, env: opEnv, q: q.Qdrant, proc: ix,
			api: api, writeToken: creds.write, operator: creds.operator, agrees: agrees})...)
	}

	// Damage both stores behind the projectors' backs (stopped, so that
	// their stores can be opened; Qdrant's points are damaged through its
	// HTTP API while projector-index runs): the points of one document
	// deleted from the embedded index; in Qdrant one chunk point of a
	// document deleted and another's chunk hash changed.
	gx.stop()
	damagedIndex, damagedGraph := []string{"doc/007"}, "doc/013"
	var err error
	if q != nil {
		// Two documents of several chunks (written at version 3).
		damagedIndex = []string{"doc/107", "doc/121"}
		damageQdrant(t, qdrantREST{url: q.HTTPURL, key: q.APIKey}, q.Collection, damagedIndex[0], damagedIndex[1])
	} else {
		ix.stop()
		is, err := embedded.Open(filepath.Join(data, "index"), embedded.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := is.DeleteStale(context.Background(), []index.Keep{{Key: damagedIndex[0]}}); err != nil {
			t.Fatal(err)
		}
		_ = is.Close()
		ix.start()
	}
	var gs graph.Backend
	if n != nil {
		gs, err = neo4j.New(context.Background(), neo4j.Config{URL: graphURL, User: n.User, Password: n.Password, TLS: graphTLS})
	} else {
		var liveGraph string
		if liveGraph, err = graphDirs.Live(); err == nil {
			gs, err = graphembedded.Open(graphDirs.Path(liveGraph), graphembedded.Options{})
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	v, ok, err := gs.Document(context.Background(), damagedGraph)
	if err != nil || !ok {
		t.Fatalf("graph document %s: %v %v", damagedGraph, ok, err)
	}
	damaged := v.Doc
	damaged.Repair = true // the same version, written again without its chunks
	damaged.Chunks = nil
	// Retried as the projector retries: a loaded machine can make a
	// transaction outlast its timeout.
	for attempt := 1; ; attempt++ {
		_, err := gs.Apply(context.Background(), []graph.Doc{damaged})
		if err == nil {
			break
		}
		if projector.IsPermanent(err) || attempt == 5 {
			t.Fatalf("damaging %s (attempt %d): %v", damagedGraph, attempt, err)
		}
		t.Logf("damaging %s (attempt %d): %v; again", damagedGraph, attempt, err)
		time.Sleep(time.Second)
	}
	_ = gs.Close()
	gx.start()
	testenv.Eventually(t, "the projectors to be ready again", 60*time.Second, func() bool { return ix.ready() && gx.ready() })

	out, err := cmd.run(opEnv, verifyArgs...)
	if err == nil {
		t.Fatalf("converge verify exited 0 after the damage:\n%s", out)
	}
	var rep struct {
		Agrees bool `json:"agrees"`
		Stores []struct {
			Store       string `json:"store"`
			Differences []struct {
				Key     string `json:"key"`
				Problem string `json:"problem"`
			} `json:"differences"`
		} `json:"stores"`
	}
	if err := json.Unmarshal([]byte(out[:strings.LastIndexByte(out, '}')+1]), &rep); err != nil {
		t.Fatalf("verify --json: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, s := range rep.Stores {
		for _, d := range s.Differences {
			got[s.Store+" "+d.Key] = d.Problem
		}
	}
	want := map[string]string{"graph " + damagedGraph: "stale_chunks"}
	for _, key := range damagedIndex {
		want["index "+key] = "stale_chunks"
	}
	if rep.Agrees || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("verify named %v, want exactly %v", got, want)
	}
	// --repair re-emits those documents through the writer; the normal
	// path repairs them and verify agrees again.
	out, err = cmd.run(opEnv, "verify", "--repair", "-index-addr", ix.addr, "-graph-addr", gx.addr, "-writer-url", api)
	if err != nil {
		t.Fatalf("converge verify --repair: %v\n%s", err, out)
	}
	if _, err := cmd.run(opEnv, verifyArgs...); err != nil {
		t.Fatal("converge verify fails after the repair")
	}
	if q != nil {
		// Past the adapter too: every point of the collection is one of
		// Postgres's chunks or markers again.
		qdrantEqualsPostgres(t, q.Qdrant, dbURL)
	}

	spy.check(t, func(what, text string) { refusals.observed = append(refusals.observed, what+": "+text) })

	// No secret of the run in what any process printed or served, nor on
	// any command line.
	sources := map[string]string{"converge commands": cmd.logs.String()}
	var argv strings.Builder
	for _, s := range append(services, refusals.processes...) {
		sources[s.name+" output"] = s.logs.String()
		fmt.Fprintf(&argv, "%s %s\n", s.name, strings.Join(s.args, " "))
	}
	sources["command lines"] = argv.String()
	for _, s := range services {
		sources[s.name+" /metrics"] = scrape(serviceURL(s.addr)+"/metrics", "")
	}
	for i, r := range rebuilds {
		sources[fmt.Sprintf("converge rebuild output %d", i+1)] = r.out.String()
	}
	for what, body := range refusals.responses {
		sources[what] = body
	}
	problems, checked := creds.secrets.problems(sources)
	for _, p := range problems {
		t.Errorf("secrets check: %s", p)
	}
	if len(problems) == 0 {
		t.Logf("secrets check: none of the %d secrets in %d sources (%d bytes)", len(creds.secrets), len(sources), checked)
	}
	for _, r := range refusals.observed {
		t.Logf("refused: %s", r)
	}
	for _, l := range links {
		t.Logf("TLS: %s", l)
	}
	t.Logf("graph projector SIGKILLed during its rebuild: %v", killedDuringRebuild)
	indexRebuilds := ""
	if q != nil {
		indexRebuilds = ", the index in Qdrant rebuilt 3 times (its projector SIGKILLed during one)"
	}
	t.Logf("4 services SIGKILLed and restarted during the load, the index replayed, the graph rebuilt (in place: %v) while 100 documents changed%s; verify agreed on 400 documents, then named exactly the %d damaged ones (%v), and verify --repair repaired them",
		n != nil, indexRebuilds, len(want), got)
}

// backgroundRebuild is `converge rebuild <projector> --json` running in
// the background.
type backgroundRebuild struct {
	what string
	out  testenv.Buffer
	done chan error
}

// startRebuild starts `converge rebuild what --json` on the projector at
// addr, with env.
func startRebuild(t *testing.T, cmd *cli, env []string, what, addr string) *backgroundRebuild {
	t.Helper()
	r := &backgroundRebuild{what: what, done: make(chan error, 1)}
	c := cmd.command(env, "rebuild", what, "--json", "-"+what+"-addr", addr)
	c.Stdout, c.Stderr = &r.out, &r.out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- c.Wait() }()
	return r
}

// result waits up to timeout for the command to end, and returns the
// rebuild's final status and whether the verify after it agreed.
func (r *backgroundRebuild) result(t *testing.T, timeout time.Duration) (rebuild.Status, bool) {
	t.Helper()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("converge rebuild %s: %v\n%s", r.what, err, r.out.String())
		}
	case <-time.After(timeout):
		t.Fatalf("converge rebuild %s did not finish within %v:\n%s", r.what, timeout, r.out.String())
	}
	var rebuilt struct {
		Rebuild rebuild.Status `json:"rebuild"`
		Verify  struct {
			Agrees bool `json:"agrees"`
		} `json:"verify"`
	}
	out := r.out.String()
	if err := json.Unmarshal([]byte(out[max(strings.IndexByte(out, '{'), 0):]), &rebuilt); err != nil {
		t.Fatalf("converge rebuild %s --json: %v\n%s", r.what, err, out)
	}
	return rebuilt.Rebuild, rebuilt.Verify.Agrees
}

// rebuildStatus is the status of the last rebuild the projector at addr
// (host:port or a URL, see serviceURL) reports (zero when it does not
// answer).
func rebuildStatus(addr, token string) rebuild.Status {
	var st rebuild.Status
	req, _ := http.NewRequest(http.MethodGet, serviceURL(addr)+rebuild.AdminPath, nil)
	auth.SetBearer(req.Header, token)
	resp, err := serviceClient.Do(req)
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// rebuildStarted reports whether the projector at addr runs or has run a
// rebuild other than the one called before (its ID; "" for none).
func rebuildStarted(addr, token, before string) func() bool {
	return func() bool {
		st := rebuildStatus(addr, token)
		return st.ID != before && (st.Phase == rebuild.PhaseFilling || st.Phase == rebuild.PhaseSwitching || st.Phase == rebuild.PhaseDone)
	}
}

// changeDocuments writes version v of documents lo..hi-1 of documents(400)
// (new titles, links and tags; from version 3 on, bodies of several
// chunks) through the writer's API, ten at a time, and then sends the
// outcome.
func changeDocuments(api, token string, v int64, lo, hi int) <-chan error {
	changed := make(chan error, 1)
	go func() {
		docs := documents(400)[lo:hi]
		for j := range docs {
			i := lo + j
			docs[j].Version, docs[j].Title = v, fmt.Sprintf("Document %d, version %d", i, v)
			docs[j].Links = []string{fmt.Sprintf("doc/%03d", (i+int(v)+1)%400)}
			docs[j].Tags = []string{fmt.Sprint("t-v", v), fmt.Sprint("t", i%7)}
			for p := 3; int64(p) <= v; p++ {
				docs[j].Body += fmt.Sprintf("\n\nParagraph %d of version %d, %s.", p, v, strings.Repeat("more words ", 90))
			}
		}
		for k := 0; k < len(docs); k += 10 {
			if err := postRetrying(api, token, docs[k:min(k+10, len(docs))], 30*time.Second); err != nil {
				changed <- err
				return
			}
			time.Sleep(30 * time.Millisecond)
		}
		changed <- nil
	}()
	return changed
}

// documents are n documents doc/000.., each linking to two others, with tags.
func documents(n int) []contract.Document {
	return corpus.Sequential(n, corpus.Shape{Keys: "doc/%03d",
		Title: func(i int) string { return fmt.Sprintf("Document %d", i) },
		Body: func(i int) string {
			return fmt.Sprintf("Paragraph one of document %d.\n\nParagraph two, %s.", i, strings.Repeat("words ", 50+i%40))
		},
		Links: func(i int) []string {
			return []string{fmt.Sprintf("doc/%03d", (i+1)%n), fmt.Sprintf("doc/%03d", (i*7)%(n+10))}
		},
		Tags: func(i int) []string { return []string{fmt.Sprint("t", i%5)} },
	})
}

// postRetrying posts docs to the writer's batch API with token, retrying
// while the writer is down (a rewrite of the same versions is "unchanged").
func postRetrying(api, token string, docs []contract.Document, timeout time.Duration) error {
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequest(http.MethodPost, api+"/v1/documents:batch", bytes.NewReader(body.Bytes()))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		auth.SetBearer(req.Header, token)
		resp, err := serviceClient.Do(req)
		if err == nil {
			ok := resp.StatusCode == http.StatusOK
			lines := 0
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if bytes.Contains(sc.Bytes(), []byte(`"error"`)) {
					ok = false
				}
				lines++
			}
			_ = resp.Body.Close()
			if ok && lines == len(docs) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the writer did not accept a batch within %v (last error: %w)", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dropSlots(t *testing.T, dbURL string) {
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		return
	}
	defer pool.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var left int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&left)
		if left == 0 {
			return
		}
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("replication slots left in the test database")
}

// tlsRun is what checkLinksAreTLS needs of a run with TLS.
type tlsRun struct {
	creds     *credentials
	nats      natsRun
	services  []*process
	apiListen string // the writer's API, host:port
	graphURL  string // bolt+s:// of the Neo4j server
	neo4j     testenv.Neo4j
	qdrant    testenv.QdrantTLS
}

// checkLinksAreTLS checks, while the services of r run, that every link
// is TLS indeed, not merely configured: Postgres reports TLS on each
// connection of converge's roles to the run's database (the relay's
// replication connection among them) and refuses them a connection
// without; the NATS server reports TLS on each client connection and
// answers a plain one with nothing; each HTTP listener refuses plain
// HTTP and a client that does not trust the run's CA; Qdrant refuses a
// client without the CA, and plain ones; Neo4j's Bolt port answers TLS
// with a certificate its CA signed, so a client that trusts the system's
// roots or another CA (the run's) is refused, while plain Bolt stays open
// on the same port for the other tests. It returns what it saw.
func checkLinksAreTLS(t *testing.T, r tlsRun) []string {
	t.Helper()
	ctx := context.Background()
	var saw []string

	// Postgres: the test's own connection is the superuser's, without TLS.
	pool, err := pgxpool.New(ctx, r.creds.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `
		SELECT a.usename, a.backend_type, coalesce(s.ssl, false), coalesce(s.version, ''), r.pid IS NOT NULL
		FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s ON s.pid = a.pid LEFT JOIN pg_stat_replication r ON r.pid = a.pid
		WHERE a.datname = current_database() AND a.usename = ANY($1)`, roles.Names())
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]int{}
	for rows.Next() {
		var user, backend, version string
		var ssl, replication bool
		if err := rows.Scan(&user, &backend, &ssl, &version, &replication); err != nil {
			t.Fatal(err)
		}
		what := user + " " + backend
		if replication {
			what += " (replication)"
		}
		if !ssl {
			t.Errorf("postgres: a connection of %s without TLS", what)
		}
		conns[what+" "+version]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{roles.Writer + " client backend", roles.Relay + " walsender (replication)"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(conns)), func(k string) bool { return strings.HasPrefix(k, want+" TLS") }) {
			t.Errorf("postgres: no connection of %s over TLS; the connections of converge's roles: %v", want, conns)
		}
	}
	saw = append(saw, fmt.Sprintf("postgres connections of converge's roles, by role, kind and TLS version: %v", conns))
	plain, err := roles.URL(r.creds.dbURL, roles.Writer, r.creds.roles[roles.Writer]) // sslmode=disable
	if err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, plain); err == nil {
		_ = c.Close(ctx)
		t.Errorf("postgres: %s connected without TLS", roles.Writer)
	} else {
		saw = append(saw, fmt.Sprintf("postgres refused %s without TLS: %v", roles.Writer, err))
	}

	// NATS: every client connection, the services' among them, is TLS.
	cz, err := r.nats.server.Connz(&server.ConnzOptions{Username: true, Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	byUser := map[string]int{}
	for _, c := range cz.Conns {
		if c.TLSVersion == "" {
			t.Errorf("nats: the connection of %s (%s) is not TLS", c.AuthorizedUser, c.Name)
		}
		byUser[c.AuthorizedUser+" "+c.TLSVersion]++
	}
	for _, user := range []string{natsauth.UserWriter, natsauth.UserRelay, natsauth.UserIndex, natsauth.UserGraph} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(byUser)), func(k string) bool { return strings.HasPrefix(k, user+" 1.") }) {
			t.Errorf("nats: no TLS connection of %s; the connections by user and TLS version: %v", user, byUser)
		}
	}
	saw = append(saw, fmt.Sprintf("nats connections by user and TLS version: %v", byUser))
	saw = append(saw, "nats: "+plainNATSRefused(t, r.nats.URL))

	// HTTP: each listener answers HTTPS alone, and only to a client that
	// trusts the run's CA.
	listens := []string{r.apiListen}
	for _, s := range r.services {
		listens = append(listens, strings.TrimPrefix(s.addr, "https://"))
	}
	for _, listen := range listens {
		resp, err := http.Get("http://" + listen + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("http: %s answered plain HTTP: %s", listen, body)
			}
		}
		if resp, err := http.Get("https://" + listen + "/readyz"); err == nil {
			_ = resp.Body.Close()
			t.Errorf("https: %s was trusted without the run's CA", listen)
		}
	}
	saw = append(saw, fmt.Sprintf("http: %d listeners refused plain HTTP and clients without the CA", len(listens)))

	// Neo4j: its Bolt port serves TLS itself, with the certificate its
	// own CA signed: a client trusting other roots is refused, one
	// trusting that CA connects. Plain Bolt is still answered on the same
	// port (encryption level OPTIONAL), which the other tests use.
	n := r.neo4j
	for what, cfg := range map[string]neo4j.Config{
		"trusting the system's roots":     {URL: r.graphURL, User: n.User, Password: n.Password, MaxRetryTime: time.Second},
		"trusting another CA (the run's)": {URL: r.graphURL, User: n.User, Password: n.Password, MaxRetryTime: time.Second, TLS: r.creds.certs.ClientTLS()},
	} {
		if b, err := neo4j.New(ctx, cfg); err == nil {
			_ = b.Close()
			t.Errorf("neo4j: connected over TLS %s", what)
		} else if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("neo4j: a client %s failed, but not on the certificate: %v", what, err)
		} else {
			saw = append(saw, fmt.Sprintf("neo4j refused a client %s: %v", what, err))
		}
	}
	for what, cfg := range map[string]neo4j.Config{
		"over TLS trusting its CA": {URL: r.graphURL, User: n.User, Password: n.Password, TLS: n.ClientTLS(t)},
		"in plain bolt":            {URL: n.URL, User: n.User, Password: n.Password},
	} {
		if b, err := neo4j.New(ctx, cfg); err != nil {
			t.Errorf("neo4j: a client %s: %v", what, err)
		} else {
			_ = b.Close()
			saw = append(saw, "neo4j accepted a client "+what)
		}
	}

	// Qdrant: refused without the CA and in plain gRPC; accepted with the
	// CA given as qdrant.Config.TLS.
	q := r.qdrant
	for what, cfg := range map[string]qdrant.Config{
		"without the CA": {Addr: q.TLSURL, APIKey: q.APIKey, Timeout: 10 * time.Second},
		"in plain gRPC":  {Addr: strings.TrimPrefix(q.TLSURL, "https://"), APIKey: q.APIKey, Timeout: 10 * time.Second},
	} {
		if b, err := qdrant.New(ctx, cfg); err == nil {
			_ = b.Close()
			t.Errorf("qdrant: connected %s", what)
		} else {
			saw = append(saw, fmt.Sprintf("qdrant refused a client %s: %v", what, err))
		}
	}
	b, err := qdrant.New(ctx, qdrant.Config{Addr: strings.TrimPrefix(q.TLSURL, "https://"), APIKey: q.APIKey, TLS: r.creds.certs.ClientTLS()})
	if err != nil {
		t.Errorf("qdrant with the CA: %v", err)
	} else {
		_ = b.Close()
	}
	if resp, err := http.Get("http://" + strings.TrimPrefix(q.TLSHTTPURL, "https://") + "/readyz"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("qdrant: its REST API answered plain HTTP")
		}
	}
	return saw
}

// plainNATSRefused opens a plain TCP connection to the NATS server at
// natsURL, checks that its INFO requires TLS, sends a CONNECT and a PING
// in plain text, and checks that no PONG comes back before the server
// ends the connection. It returns what the server did.
func plainNATSRefused(t *testing.T, natsURL string) string {
	t.Helper()
	c, err := net.Dial("tcp", mustParseURL(t, natsURL).Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A bound, not a wait: the server ends the connection at once.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	rd := bufio.NewReader(c)
	info, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("nats: the server's INFO does not require TLS: %q, %v", info, err)
	}
	if _, err := io.WriteString(c, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n"); err != nil {
		return "ended the plain connection before the CONNECT: " + err.Error()
	}
	rest, err := io.ReadAll(rd)
	if bytes.Contains(rest, []byte("PONG")) {
		t.Errorf("nats: the server answered a plain PING: %q", rest)
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		t.Errorf("nats: the server kept a plain connection open")
	}
	return fmt.Sprintf("a plain connection's INFO requires TLS, and its PING was answered with no PONG (%d bytes, then the end)", len(rest))
}
