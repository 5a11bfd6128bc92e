package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

// Neo4j is an instance of the project's test Neo4j server (a real Neo4j 5
// Community DBMS, scripts/neo4j-server.sh), leased to one test.
type Neo4j struct {
	URL      string // bolt://127.0.0.1:PORT
	User     string
	Password string
	// CA is the PEM file of the CA that signed the certificate of the
	// server's Bolt TLS, which it offers on URL's port beside plain Bolt
	// (see [Neo4j.TLSURL]); empty when the server has no TLS.
	CA string
}

// TLSURL is URL with the scheme bolt+s: the same instance over TLS,
// verified against CA.
func (n Neo4j) TLSURL() string { return "bolt+s://" + strings.TrimPrefix(n.URL, "bolt://") }

// ClientTLS is a client configuration that trusts CA alone; t fails when
// the server has no TLS.
func (n Neo4j) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	if n.CA == "" {
		t.Fatalf("testenv: the test Neo4j server at %s offers no Bolt TLS (started with NEO4J_BOLT_TLS=0, or by an older scripts/neo4j-server.sh)", n.URL)
	}
	pem, err := os.ReadFile(n.CA)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("testenv: %s holds no PEM certificate", n.CA)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// Environment of a test run started by `scripts/neo4j-server.sh run` (as
// `make test` does): the instances, their credentials, and the folder
// holding the lease files.
const (
	EnvTestNeo4jURLs     = "CONVERGE_TEST_NEO4J_URLS"
	EnvTestNeo4jURL      = "CONVERGE_TEST_NEO4J_URL"
	EnvTestNeo4jUser     = "CONVERGE_TEST_NEO4J_USER"
	EnvTestNeo4jPassword = "CONVERGE_TEST_NEO4J_PASSWORD" //nolint:gosec // the name of a variable
	EnvTestNeo4jCA       = "CONVERGE_TEST_NEO4J_CA"
	EnvTestNeo4jDir      = "CONVERGE_TEST_NEO4J_DIR"
)

const (
	neo4jLeaseTimeout = 10 * time.Minute
	neo4jWipeTimeout  = 5 * time.Minute
	// neo4jOwnInstances is how many instances a test process starts for
	// itself when no server was given: enough for two tests at once.
	neo4jOwnInstances = 2
)

// neo4jPool is the server of this test process: the instances and where
// their lease files are.
type neo4jPool struct {
	urls     []string
	user     string
	password string
	ca       string // the Bolt TLS CA's file; empty: no TLS
	lockDir  string
}

var (
	neo4jOnce    sync.Once
	neo4jServer  *neo4jPool
	neo4jMissing error // why there is no server
)

// LeaseNeo4j returns an instance of the test Neo4j server, emptied of every
// node and relationship (the constraints stay), for t alone: no other test,
// in this process or another, uses it until t ends. A test that needs two
// graphs leases two.
//
// The server is the one a `scripts/neo4j-server.sh run` around the test
// run started (CONVERGE_TEST_NEO4J_URLS), or else one this process starts
// for itself with the same script, which stops when the process ends.
// Where neither can be had (no Java or Maven, and not root to install
// them), the test is skipped with the reason, loudly; with CI=true it
// fails instead, so that a CI run can never pass without Neo4j.
func LeaseNeo4j(t testing.TB) Neo4j {
	t.Helper()
	neo4jOnce.Do(func() { neo4jServer, neo4jMissing = findNeo4j() })
	if neo4jMissing != nil {
		noNeo4j(t, neo4jMissing)
	}
	p := neo4jServer
	url, release, err := p.lease(t)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(release)
	n := Neo4j{URL: url, User: p.user, Password: p.password, CA: p.ca}
	if err := n.wipe(); err != nil {
		t.Fatalf("testenv: emptying Neo4j at %s: %v", url, err)
	}
	return n
}

// noNeo4j ends t for want of a Neo4j server (why): a loud skip, or with
// CI=true a failure, so that a CI run can never pass without Neo4j.
func noNeo4j(t testing.TB, why error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("testenv: no Neo4j server, and CI=true requires one: %v", why)
	}
	t.Skipf("testenv: SKIPPING, no Neo4j server: %v (make test starts one; scripts/neo4j-server.sh needs Java 17 and Maven)", why)
}

// findNeo4j reads the server of the test run from the environment, or
// starts one.
func findNeo4j() (*neo4jPool, error) {
	urls := os.Getenv(EnvTestNeo4jURLs)
	if urls == "" {
		urls = os.Getenv(EnvTestNeo4jURL)
	}
	if urls != "" {
		p := &neo4jPool{urls: strings.Split(urls, ","), user: os.Getenv(EnvTestNeo4jUser),
			password: os.Getenv(EnvTestNeo4jPassword), ca: os.Getenv(EnvTestNeo4jCA), lockDir: os.Getenv(EnvTestNeo4jDir)}
		if p.lockDir == "" {
			// Tests of several packages run at once: their leases
			// must meet in one folder, named after the server.
			p.lockDir = filepath.Join(os.TempDir(), fmt.Sprintf("converge-neo4j-leases-%x", sha256.Sum256([]byte(urls)))[:60])
		}
		if err := os.MkdirAll(p.lockDir, 0o755); err != nil {
			return nil, err
		}
		return p, nil
	}
	return startOwnNeo4j(neo4jOwnInstances)
}

// Neo4jOptions are the settings of a server that [StartNeo4j] starts.
type Neo4jOptions struct {
	// TxMemory bounds the memory of each transaction, in bytes
	// (db.memory.transaction.max; Neo4j's minimum is 1 MiB); 0 leaves it
	// unbounded, as on the shared test server.
	TxMemory int64
}

// StartNeo4j starts a test Neo4j server of its own for t, with opts, and
// stops it when t ends: for a test that needs settings the shared server
// of LeaseNeo4j does not have. It costs a server start (about 10 s). Where
// no server can be had, t is skipped (or fails with CI=true) as by
// LeaseNeo4j.
func StartNeo4j(t testing.TB, opts Neo4jOptions) Neo4j {
	t.Helper()
	var env []string
	if opts.TxMemory > 0 {
		env = append(env, "NEO4J_TX_MEMORY="+strconv.FormatInt(opts.TxMemory, 10))
	}
	p, err := startOwnNeo4j(1, env...)
	if err != nil {
		noNeo4j(t, err)
	}
	t.Cleanup(func() {
		if script, err := repoFile("scripts/neo4j-server.sh"); err == nil {
			_ = exec.Command("bash", script, "stop", p.lockDir).Run()
		}
	})
	return Neo4j{URL: p.urls[0], User: p.user, Password: p.password, CA: p.ca}
}

// startOwnNeo4j starts the project's server, with instances and the extra
// settings env (NAME=VALUE), for this process alone. It watches this
// process and stops (removing its folder) when it ends.
func startOwnNeo4j(instances int, env ...string) (*neo4jPool, error) {
	script, err := repoFile("scripts/neo4j-server.sh")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "converge-neo4j-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = append(os.Environ(),
		"NEO4J_PARENT_PID="+strconv.Itoa(os.Getpid()),
		"NEO4J_INSTANCES="+strconv.Itoa(instances),
		"NEO4J_REMOVE_DIR=1")
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s start: %w: %s", script, err, strings.TrimSpace(lastLines(stderr.String(), 10)))
	}
	vars := scriptVars(out)
	if vars["CONVERGE_NEO4J_URLS"] == "" {
		return nil, fmt.Errorf("%s start printed no CONVERGE_NEO4J_URLS line: %q", script, out)
	}
	return &neo4jPool{urls: strings.Split(vars["CONVERGE_NEO4J_URLS"], ","), user: vars["CONVERGE_NEO4J_USER"],
		password: vars["CONVERGE_NEO4J_PASSWORD"], ca: vars["CONVERGE_NEO4J_CA"], lockDir: dir}, nil
}

// lease takes the first free instance, waiting for one; release frees it.
// A lease is an exclusive flock on the instance's lease file, which the
// kernel drops if the process dies.
func (p *neo4jPool) lease(t testing.TB) (url string, release func(), err error) {
	deadline := time.Now().Add(neo4jLeaseTimeout)
	for {
		for i, url := range p.urls {
			f, err := os.OpenFile(filepath.Join(p.lockDir, fmt.Sprintf("lease-%d", i)), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				return "", nil, fmt.Errorf("neo4j lease: %w", err)
			}
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			if err == nil {
				return url, func() { _ = f.Close() }, nil // closing drops the lock
			}
			_ = f.Close()
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				return "", nil, fmt.Errorf("neo4j lease: %w", err)
			}
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("no Neo4j instance of %d was free within %v", len(p.urls), neo4jLeaseTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wipe deletes every node and relationship, in transactions of 10,000
// nodes.
func (n Neo4j) wipe() error {
	ctx, cancel := context.WithTimeout(context.Background(), neo4jWipeTimeout)
	defer cancel()
	driver, err := neo4j.NewDriverWithContext(n.URL, neo4j.BasicAuth(n.User, n.Password, ""))
	if err != nil {
		return err
	}
	defer func() { _ = driver.Close(ctx) }()
	session := driver.NewSession(ctx, neo4j.SessionConfig{})
	defer func() { _ = session.Close(ctx) }()
	// CALL ... IN TRANSACTIONS runs only in an implicit transaction.
	res, err := session.Run(ctx, `MATCH (n) CALL { WITH n DETACH DELETE n } IN TRANSACTIONS OF 10000 ROWS`, nil)
	if err != nil {
		return err
	}
	_, err = res.Consume(ctx)
	return err
}

// repoFile finds path relative to the module's root, walking up from the
// test's working directory (its package folder).
func repoFile(path string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, path), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory, so no %s", path)
		}
		dir = parent
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// scriptVars reads the KEY=VALUE lines a server script's start printed.
func scriptVars(out []byte) map[string]string {
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = v
		}
	}
	return vars
}
