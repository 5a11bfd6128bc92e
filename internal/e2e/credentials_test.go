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

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index/backends"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/roles"

	"github.com/converge-sync/converge/internal/testenv"
)

// credentialVars are the variables that carry a credential. No child
// inherits them from the test's environment: each gets its own alone.
var credentialVars = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE", "PGPASSWORD", "PGPASSFILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE", natsauth.EnvCreds, natsauth.EnvNKey,
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
	"CONVERGE_OWNER_PASSWORD", "CONVERGE_WRITER_PASSWORD", "CONVERGE_RELAY_PASSWORD", "CONVERGE_READER_PASSWORD",
	"CONVERGE_NEO4J_PASSWORD", backends.EnvQdrantAPIKey,
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
	secrets                       secrets
}

func newCredentials(t *testing.T, dbURL string) *credentials {
	t.Helper()
	c := &credentials{dbURL: dbURL, roles: map[string]string{}, nats: map[string]string{}, secrets: secrets{}}
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
	u, err := roles.URL(c.dbURL, role, c.roles[role])
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// postgresEnv is the environment that gives a process role's URL: the
// password stays out of the process list.
func (c *credentials) postgresEnv(t *testing.T, role string) []string {
	t.Helper()
	return []string{config.EnvPostgresURL + "=" + c.roleURL(t, role)}
}

// natsArgs and natsEnv make a process connect to NATS as user.
func natsArgs(user string) []string { return []string{"-nats-user", user} }

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

// startNATS starts the embedded server admitting the natsauth users alone,
// each with its password of c.
func (c *credentials) startNATS(t *testing.T) *natsserver.Server {
	t.Helper()
	s, err := natsserver.StartWith(natsserver.Options{StoreDir: t.TempDir(), Port: -1, Users: natsauth.Users(c.nats)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// requirePasswords makes the cluster ask converge's roles for their
// passwords (scram-sha-256) on TCP, instead of trusting them as it trusts
// every local connection, until the test ends: a service given a wrong
// password is refused, so that the passwords the test hands out are
// the ones that get each service in. The superuser stays trusted.
func requirePasswords(t *testing.T, adminURL string) {
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
	rule := "host all " + strings.Join(roles.Names(), ",") + " 127.0.0.1/32 scram-sha-256\n"
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
	logs testenv.Buffer // command lines and outputs, for the secrets check
}

// command is `converge args...` with env (credentials) added to the test's
// environment without its credentials.
func (c *cli) command(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.path, args...)
	cmd.Env = append(withoutCredentials(), env...)
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
	resp, err := http.DefaultClient.Do(req)
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
