//go:build linux

package e2e_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// credentialVars are the variables that carry a credential. No child
// inherits them from the test's environment: each gets its own alone.
var credentialVars = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE", "PGPASSWORD", "PGPASSFILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE", natsauth.EnvCreds, natsauth.EnvNKey,
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
	"CONVERGE_OWNER_PASSWORD", "CONVERGE_WRITER_PASSWORD", "CONVERGE_RELAY_PASSWORD", "CONVERGE_READER_PASSWORD",
	"CONVERGE_NEO4J_PASSWORD", indexprojector.EnvQdrantAPIKey,
	// Not credentials, but what a run trusts: each child gets the run's.
	// SSL_CERT_* would make the Neo4j and Qdrant drivers trust other roots.
	natsauth.EnvCA, auth.EnvTLSCA, indexprojector.EnvQdrantCA, graphprojector.EnvNeo4jCA, "SSL_CERT_FILE", "SSL_CERT_DIR",
}

// credentials are the secrets of one run of the binaries, made for it: a
// password for each Postgres role and each NATS user, and the HTTP tokens.
type credentials struct {
	dbURL                         string            // the test database as the superuser (the test's own access)
	roles                         map[string]string // role -> password
	nats                          map[string]string // NATS user -> password
	write                         string            // the client's token: write
	read                          string            // a read-only token
	operator                      string            // the operator's token (CONVERGE_TOKEN of the CLI): admin,read
	writerTokens, projectorTokens string            // the tokens files
	// certs are the CA and key pair of a run with TLS on every listener
	// and every link; nil: plain connections.
	certs   *testenv.Certificates
	secrets secrets
}

// newCredentials makes the credentials of a run on the database at dbURL;
// with certs, every connection they make is over TLS, verified against
// certs' CA, and the key pair's private key is a secret of the run.
func newCredentials(t *testing.T, dbURL string, certs *testenv.Certificates) *credentials {
	t.Helper()
	c := &credentials{dbURL: dbURL, roles: map[string]string{}, nats: map[string]string{}, certs: certs, secrets: secrets{}}
	if certs != nil {
		// Its base64 body, not the header line every key has; the
		// body's first characters (leakPrefix) are those of every P-256
		// key too, so any private key printed is caught.
		body := strings.Join(slices.DeleteFunc(strings.Split(string(certs.KeyPEM), "\n"),
			func(line string) bool { return line == "" || strings.HasPrefix(line, "-----") }), "\n")
		c.secrets["TLS private key"] = body
	}
	for _, r := range roles.Names() {
		c.roles[r] = rand.Text()
		c.secrets["postgres password of "+r] = c.roles[r]
	}
	for _, u := range []string{natsauth.UserRelay, natsauth.UserWriter, natsauth.UserIndex, natsauth.UserGraph,
		natsauth.UserNotifier, natsauth.UserProducer, natsauth.UserOperator} {
		c.nats[u] = rand.Text()
		c.secrets["nats password of "+u] = c.nats[u]
	}
	c.write, c.read, c.operator = rand.Text(), rand.Text(), rand.Text()
	c.secrets["client token (write)"] = c.write
	c.secrets["reader token (read)"] = c.read
	c.secrets["operator token (admin,read)"] = c.operator
	dir := t.TempDir()
	c.writerTokens = filepath.Join(dir, "writer.tokens")
	c.projectorTokens = filepath.Join(dir, "projectors.tokens")
	files := map[string]string{
		c.writerTokens: fmt.Sprintf("client write %s\noperator admin,read %s\nreader read %s\n", c.write, c.operator, c.read),
		// verify and rebuild: the operator; search and the graph: readers.
		c.projectorTokens: fmt.Sprintf("operator admin,read %s\nreader read %s\n", c.operator, c.read),
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// roleURL is the test database's URL as role, with its password.
func (c *credentials) roleURL(t *testing.T, role string) string {
	t.Helper()
	return c.urlAs(t, role, c.roles[role])
}

// urlAs is the test database's URL as role with password; with TLS, it
// requires TLS and verifies the server (sslmode=verify-full).
func (c *credentials) urlAs(t *testing.T, role, password string) string {
	t.Helper()
	u, err := roles.URL(c.dbURL, role, password)
	if err != nil {
		t.Fatal(err)
	}
	return c.postgresURL(u)
}

// postgresURL is u, with TLS required and verified when the run has TLS.
func (c *credentials) postgresURL(u string) string {
	if c.certs == nil {
		return u
	}
	return testenv.VerifyFullURL(u, c.certs.CAFile)
}

// postgresEnv is the environment that gives a process role's URL: the
// password stays out of the process list.
func (c *credentials) postgresEnv(t *testing.T, role string) []string {
	t.Helper()
	return []string{config.EnvPostgresURL + "=" + c.roleURL(t, role)}
}

// natsArgs and natsEnv make a process connect to NATS as user; with TLS,
// trusting the run's CA alone.
func (c *credentials) natsArgs(user string) []string {
	if c.certs != nil {
		return []string{"-nats-user", user, "-nats-ca", c.certs.CAFile}
	}
	return []string{"-nats-user", user}
}

func (c *credentials) natsEnv(user string) []string {
	return []string{natsauth.EnvPassword + "=" + c.nats[user]}
}

// rolesEnv holds every role's password, for `converge roles apply`.
func (c *credentials) rolesEnv() []string {
	return []string{
		"CONVERGE_OWNER_PASSWORD=" + c.roles[roles.Owner],
		"CONVERGE_WRITER_PASSWORD=" + c.roles[roles.Writer],
		"CONVERGE_RELAY_PASSWORD=" + c.roles[roles.Relay],
		"CONVERGE_READER_PASSWORD=" + c.roles[roles.Reader],
	}
}

// httpArgs are a service's flags of its HTTP listeners: with TLS, the
// run's key pair.
func (c *credentials) httpArgs() []string {
	if c.certs != nil {
		return []string{"-tls-cert", c.certs.CertFile, "-tls-key", c.certs.KeyFile}
	}
	return nil
}

// serviceAddr is how the test and the CLI address a service listening on
// listen (host:port): as is, or as an https:// URL with TLS.
func (c *credentials) serviceAddr(listen string) string {
	if c.certs != nil {
		return "https://" + listen
	}
	return listen
}

// cliEnv is the environment every converge command of the run gets: with
// TLS, the CA its https:// clients trust.
func (c *credentials) cliEnv() []string {
	if c.certs != nil {
		return []string{auth.EnvTLSCA + "=" + c.certs.CAFile}
	}
	return nil
}

// natsRun is the NATS server of a run, in the test process.
type natsRun struct {
	URL    string
	server *server.Server
}

// startNATS starts the embedded server admitting the natsauth users alone,
// each with its password of c; with TLS, it requires TLS of every client
// (the run's key pair).
func (c *credentials) startNATS(t *testing.T) natsRun {
	t.Helper()
	if c.certs == nil {
		s, err := natsserver.StartWith(natsserver.Options{StoreDir: t.TempDir(), Port: -1, Users: natsauth.Users(c.nats)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		return natsRun{URL: s.URL, server: s.Server}
	}
	// natsserver's options, with TLS: it offers no TLS of its own.
	tlsConfig, err := c.certs.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, MaxPayload: contract.MaxMessageBytes, Users: natsauth.Users(c.nats),
		TLS: true, TLSConfig: tlsConfig, TLSTimeout: 10}) // seconds: a loaded machine's handshakes are slow
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with TLS not ready within 10 s")
	}
	return natsRun{URL: ns.ClientURL(), server: ns}
}

// requirePasswords makes the cluster ask converge's roles for their
// passwords (scram-sha-256) on TCP, instead of trusting them as it trusts
// every local connection, until the test ends: a service given a wrong
// password is refused, so that the passwords the test hands out are
// the ones that get each service in. The superuser stays trusted.
//
// With tlsOnly, converge's roles are refused on connections without TLS.
func requirePasswords(t *testing.T, adminURL string, tlsOnly bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var path string
	if err := conn.QueryRow(ctx, "SHOW hba_file").Scan(&path); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Join(roles.Names(), ",")
	rule := "host all " + names + " 127.0.0.1/32 scram-sha-256\n"
	if tlsOnly {
		rule = "hostssl all " + names + " 127.0.0.1/32 scram-sha-256\nhostnossl all " + names + " 127.0.0.1/32 reject\n"
	}
	reload := func(text []byte) error {
		// Written in place: the file keeps its owner, the server's user.
		if err := os.WriteFile(path, text, 0o600); err != nil {
			return err
		}
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var bad int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL").Scan(&bad); err != nil {
			return err
		}
		if bad > 0 {
			return fmt.Errorf("%s: %d rules in error", path, bad)
		}
		_, err = c.Exec(ctx, "SELECT pg_reload_conf()")
		return err
	}
	if err := reload(append([]byte(rule), before...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := reload(before); err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	})
}

// cli runs `converge` commands, each with its own credentials alone, and
// keeps every command line and everything each printed.
type cli struct {
	t    *testing.T
	path string
	env  []string       // added to every command's (credentials.cliEnv)
	logs testenv.Buffer // command lines and outputs, for the secrets check
}

// command is `converge args...` with env (credentials) added to the test's
// environment without its credentials.
func (c *cli) command(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.path, args...)
	cmd.Env = append(append(withoutCredentials(), c.env...), env...)
	fmt.Fprintf(&c.logs, "$ converge %s\n", strings.Join(args, " "))
	return cmd
}

// run runs `converge args...` to its end and returns its stdout and stderr.
func (c *cli) run(env []string, args ...string) (string, error) {
	out, err := c.command(env, args...).CombinedOutput()
	_, _ = c.logs.Write(out)
	return string(out), err
}

func withoutCredentials() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(credentialVars, name) {
			env = append(env, kv)
		}
	}
	return env
}

// secrets are the secrets of a run, by what they are.
type secrets map[string]string

// leakPrefix is how much of a secret counts as a leak: a secret cut short
// in a log line leaks as much as the whole.
const leakPrefix = 12

// leaks names the secrets that text holds, whole or their first
// leakPrefix characters.
func (s secrets) leaks(text string) []string {
	var found []string
	for name, v := range s {
		if strings.Contains(text, v) || (len(v) > leakPrefix && strings.Contains(text, v[:leakPrefix])) {
			found = append(found, name)
		}
	}
	slices.Sort(found)
	return found
}

// problems are the secrets found in each source (what was printed or
// served, by where it was), and every empty source: a check of nothing
// would pass vacuously. n is the bytes checked.
func (s secrets) problems(sources map[string]string) (problems []string, n int) {
	for _, where := range slices.Sorted(maps.Keys(sources)) {
		text := sources[where]
		if strings.TrimSpace(text) == "" {
			problems = append(problems, where+" is empty")
		}
		n += len(text)
		if found := s.leaks(text); len(found) > 0 {
			problems = append(problems, where+" holds "+strings.Join(found, ", "))
		}
	}
	return problems, n
}

// scrape is a GET of url's body ("" when it fails).
func scrape(url string, token string) string {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	auth.SetBearer(req.Header, token)
	resp, err := serviceClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// The secrets check finds a planted secret, whole or cut short, and only
// those planted; and it refuses a source with nothing in it.
func TestSecretsCheckFindsPlantedSecrets(t *testing.T) {
	s := secrets{"a": rand.Text(), "b": rand.Text(), "c": rand.Text()}
	sources := map[string]string{
		"writer":   "level=INFO msg=connected url=postgres://converge_writer:" + s["a"] + "@127.0.0.1/x\n",
		"relay":    "level=ERROR msg=refused token=" + s["b"][:leakPrefix] + "...\n",
		"clean":    "level=INFO msg=ready\n",
		"/metrics": "",
	}
	got, n := s.problems(sources)
	want := []string{"/metrics is empty", "relay holds b", "writer holds a"}
	if !slices.Equal(got, want) || n == 0 {
		t.Fatalf("problems %q (%d bytes), want %q", got, n, want)
	}
	if got, _ := s.problems(map[string]string{"clean": "nothing secret here"}); len(got) != 0 {
		t.Fatalf("problems %q in a clean source", got)
	}
}
