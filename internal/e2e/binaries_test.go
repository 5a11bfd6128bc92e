//go:build linux

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/proc"
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
	addr string   // its metrics address: /readyz
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

func (s *process) ready() bool { return stack.HTTPOK("http://" + s.addr + "/readyz") }

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := stack.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestBinariesSurviveKillsAndVerify runs the real binaries as separate
// processes (writer, relay, both projectors; Postgres and NATS are the test's
// own), SIGKILLs each service once while documents are written, replays
// the index projector, rebuilds the graph while documents change
// (SIGKILLing its projector during the rebuild), and checks with `converge
// verify` (the binary) that every store agrees; then it damages the index
// and the graph behind the projectors' backs, checks that verify names
// exactly those documents, and that `verify --repair` repairs them. It runs
// twice: with the graph projector on the embedded graph (rebuilt
// blue/green), and on the real Neo4j server (rebuilt in place). Each
// process runs with its own credentials alone, the binaries refuse what
// those do not allow (checkDenials), and no secret of the run appears in
// any output, command line or /metrics.
func TestBinariesSurviveKillsAndVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs every binary")
	}
	bin := testenv.BuildBinaries(t)
	t.Run("embedded-graph", func(t *testing.T) { testBinaries(t, bin, nil) })
	t.Run("neo4j-graph", func(t *testing.T) {
		n := testenv.LeaseNeo4j(t)
		testBinaries(t, bin, &n)
	})
}

// testBinaries is TestBinariesSurviveKillsAndVerify with the graph in n, or
// in the embedded graph when n is nil. Every process holds its own
// credentials alone, passwords and tokens in its environment (never on its
// command line): the roles are applied on an empty database by `converge
// roles apply`, which `converge migrate up` migrates as converge_owner; the
// writer logs in as converge_writer, the relay as converge_relay, verify
// and status as converge_reader, and the cluster checks their passwords;
// NATS admits the natsauth users alone, each service as its own; the
// writer and the projectors take tokens files, the CLI the operator's
// token. At the end no secret of the run may be in any output.
func testBinaries(t *testing.T, bin *testenv.Binaries, n *testenv.Neo4j) {
	dbURL := pg.NewDatabase(t)
	adminURL := pg.Cluster.URL("postgres")
	creds := newCredentials(t, dbURL)
	if n != nil {
		creds.secrets["neo4j password"] = n.Password
	}
	requirePasswords(t, adminURL)
	nats := creds.startNATS(t)
	data := t.TempDir()
	cmd := &cli{t: t, path: bin.Path("converge")}
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

	httpAddr := freePort(t)
	svc := func(name, addr, natsUser string, env []string, args ...string) *process {
		args = append(append(args, "-nats-url", nats.URL), natsArgs(natsUser)...)
		return &process{t: t, name: name, bin: bin.Path(name), args: args, addr: addr,
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
		svc("projector-index", iAddr, natsauth.UserIndex, nil,
			"-data-dir", data, "-metrics-addr", iAddr, "-ack-wait", "5s", "-tokens-file", creds.projectorTokens),
		svc("projector-graph", gAddr, natsauth.UserGraph, nil,
			"-data-dir", data, "-metrics-addr", gAddr, "-ack-wait", "5s", "-tokens-file", creds.projectorTokens),
	}
	if n != nil {
		// The password through the environment: never on a command line.
		g := services[3]
		g.args = append(g.args, "-neo4j-url", n.URL, "-neo4j-user", n.User)
		g.env = append(g.env, "CONVERGE_NEO4J_PASSWORD="+n.Password)
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
	relayActive := func() bool {
		resp, err := http.Get("http://" + rAddr + "/metrics")
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

	api := "http://" + httpAddr
	refusals := checkDenials(t, denialRun{bin: bin, cli: cmd, creds: creds, natsURL: nats.URL, api: api, indexAddr: iAddr})

	// The operator's credentials: the reader's URL, the operator's token
	// (verify reads the projectors, rebuild and --repair are admin's), and
	// its NATS user (replay, status).
	opEnv := append(append([]string{}, reader...), auth.EnvToken+"="+creds.operator)
	opNATS := append(natsArgs(natsauth.UserOperator), "-nats-url", nats.URL)
	opNATSEnv := append(append([]string{}, reader...), creds.natsEnv(natsauth.UserOperator)...)

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

	verifyArgs := []string{"verify", "--json", "-index-addr", iAddr, "-graph-addr", gAddr}
	agrees := func() bool {
		_, err := cmd.run(opEnv, verifyArgs...)
		return err == nil
	}
	testenv.Eventually(t, "converge verify to exit 0 after the kills", 90*time.Second, agrees)

	// Replay the index projector from the start, and rebuild the graph
	// from scratch, SIGKILLing its projector in the middle of the rebuild:
	// the restarted projector resumes it, and converge rebuild (which
	// keeps polling through the restart) reports it done and verified.
	if out, err := cmd.run(opNATSEnv, append([]string{"replay", "index", "--from-seq", "1"}, opNATS...)...); err != nil {
		t.Fatalf("converge replay index: %v\n%s", err, out)
	}
	gx := services[3]
	rebuildCmd := cmd.command(opEnv, "rebuild", "graph", "--json", "-graph-addr", gAddr)
	var rebuildOut bytes.Buffer
	rebuildCmd.Stdout, rebuildCmd.Stderr = &rebuildOut, &rebuildOut
	if err := rebuildCmd.Start(); err != nil {
		t.Fatal(err)
	}
	rebuildDone := make(chan error, 1)
	go func() { rebuildDone <- rebuildCmd.Wait() }()
	// Live traffic during the rebuild: a second version of 100 documents
	// (new titles, links and tags).
	changed := make(chan error, 1)
	go func() {
		v2 := documents(400)[:100]
		for i := range v2 {
			v2[i].Version, v2[i].Title = 2, fmt.Sprintf("Document %d, second version", i)
			v2[i].Links = []string{fmt.Sprintf("doc/%03d", (i+3)%400)}
			v2[i].Tags = []string{"t-second", fmt.Sprint("t", i%7)}
		}
		for lo := 0; lo < len(v2); lo += 10 {
			if err := postRetrying(api, creds.write, v2[lo:lo+10], 30*time.Second); err != nil {
				changed <- err
				return
			}
			time.Sleep(30 * time.Millisecond)
		}
		changed <- nil
	}()
	phase := func() string {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gAddr+rebuild.AdminPath, nil)
		auth.SetBearer(req.Header, creds.operator)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		var st rebuild.Status
		_ = json.NewDecoder(resp.Body).Decode(&st)
		return st.Phase
	}
	testenv.Eventually(t, "the graph rebuild to start", 30*time.Second, func() bool {
		p := phase()
		return p == rebuild.PhaseFilling || p == rebuild.PhaseSwitching || p == rebuild.PhaseDone
	})
	killedDuringRebuild := phase() != rebuild.PhaseDone
	gx.kill()
	gx.start()
	testenv.Eventually(t, "projector-graph to be ready after the kill", 60*time.Second, gx.ready)
	select {
	case err := <-rebuildDone:
		if err != nil {
			t.Fatalf("converge rebuild graph: %v\n%s", err, rebuildOut.String())
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("converge rebuild graph did not finish:\n%s", rebuildOut.String())
	}
	var rebuilt struct {
		Rebuild rebuild.Status `json:"rebuild"`
		Verify  struct {
			Agrees bool `json:"agrees"`
		} `json:"verify"`
	}
	if err := json.Unmarshal(rebuildOut.Bytes()[bytes.IndexByte(rebuildOut.Bytes(), '{'):], &rebuilt); err != nil {
		t.Fatalf("converge rebuild --json: %v\n%s", err, rebuildOut.String())
	}
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if rebuilt.Rebuild.Phase != rebuild.PhaseDone || !rebuilt.Verify.Agrees || rebuilt.Rebuild.InPlace != (n != nil) {
		t.Fatalf("converge rebuild graph (want in place: %v): %s", n != nil, rebuildOut.String())
	}
	graphDirs := rebuild.Dirs{Root: data, Base: "graph"}
	if live, err := graphDirs.Live(); n == nil && (err != nil || live == "graph") {
		t.Fatalf("live graph generation after the rebuild: %q, %v; want a fresh one", live, err)
	}
	testenv.Eventually(t, "converge verify to exit 0 after the replays", 90*time.Second, agrees)
	if out, err := cmd.run(opNATSEnv, append([]string{"status"}, opNATS...)...); err != nil || !strings.Contains(out, "CONSUMER") {
		t.Fatalf("converge status: %v\n%s", err, out)
	}

	// Damage both stores behind the projectors' backs (stopped, so that
	// their stores can be opened).
	ix := services[2]
	ix.stop()
	gx.stop()
	damagedIndex, damagedGraph := "doc/007", "doc/013"
	is, err := embedded.Open(filepath.Join(data, "index"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := is.DeleteStale(context.Background(), []index.Keep{{Key: damagedIndex}}); err != nil {
		t.Fatal(err)
	}
	_ = is.Close()
	var gs graph.Backend
	if n != nil {
		gs, err = neo4j.New(context.Background(), neo4j.Config{URL: n.URL, User: n.User, Password: n.Password})
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
	if _, err := gs.Apply(context.Background(), []graph.Doc{damaged}); err != nil {
		t.Fatal(err)
	}
	_ = gs.Close()
	ix.start()
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
	want := map[string]string{"index " + damagedIndex: "stale_chunks", "graph " + damagedGraph: "stale_chunks"}
	if rep.Agrees || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("verify named %v, want exactly %v", got, want)
	}
	// --repair re-emits those documents through the writer; the normal
	// path repairs them and verify agrees again.
	out, err = cmd.run(opEnv, "verify", "--repair", "-index-addr", iAddr, "-graph-addr", gAddr, "-writer-url", api)
	if err != nil {
		t.Fatalf("converge verify --repair: %v\n%s", err, out)
	}
	if _, err := cmd.run(opEnv, verifyArgs...); err != nil {
		t.Fatal("converge verify fails after the repair")
	}

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
		sources[s.name+" /metrics"] = scrape("http://"+s.addr+"/metrics", "")
	}
	sources["converge rebuild output"] = rebuildOut.String()
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
	t.Logf("graph projector SIGKILLed during its rebuild: %v", killedDuringRebuild)
	t.Logf("4 services SIGKILLed and restarted during the load, the index replayed, the graph rebuilt (in place: %v) while 100 documents changed; verify agreed on 400 documents, then named exactly the 2 damaged ones (%v), and verify --repair repaired them", n != nil, got)
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
		resp, err := http.DefaultClient.Do(req)
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
