package deploy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/telemetry"
)

const (
	secretsScript = "deploy/secrets.sh"
	// secretsHostDir is where deploy/secrets.sh writes the stack's secrets
	// and docker-compose.yml reads them.
	secretsHostDir = "deploy/secrets"
	// superuser is the postgres image's administrator (POSTGRES_USER's
	// default), as which the roles service applies internal/roles.
	superuser = "postgres"
	// caSecret is the secret of the stack's CA certificate, with which
	// every client verifies the server it reaches.
	caSecret = "ca-cert"
)

// holding is what one service of docker-compose.yml holds of credentials:
// exactly this, nothing more.
type holding struct {
	postgresRole string   // the role of its CONVERGE_POSTGRES_URL; "": no URL
	natsUser     string   // its CONVERGE_NATS_USER (internal/natsauth); "": no NATS
	tokens       bool     // a tokens file (CONVERGE_TOKENS_FILE): it serves an API
	tls          bool     // a certificate and key for its HTTP listeners (CONVERGE_TLS_CERT, _KEY)
	secrets      []string // the secrets mounted into it
	env          []string // its other variables that carry or name a credential
}

// holdings is who holds what. A service that is not here fails the test:
// adding one means saying what it may hold.
var holdings = map[string]holding{
	"postgres": {secrets: []string{"postgres-password", "postgres-tls-cert", "postgres-tls-key"}, env: []string{"POSTGRES_PASSWORD_FILE"}},
	"nats":     {secrets: []string{"nats-users", "nats-tls-cert", "nats-tls-key"}},
	"qdrant":   {secrets: []string{"qdrant-config"}},
	"neo4j":    {secrets: []string{"neo4j-auth"}, env: []string{"NEO4J_AUTH_FILE"}},
	"roles": {
		postgresRole: superuser,
		secrets:      []string{caSecret, "postgres-pgpass", "owner-password", "writer-password", "relay-password", "reader-password", "producer-password"},
		env:          []string{"CONVERGE_OWNER_PASSWORD_FILE", "CONVERGE_WRITER_PASSWORD_FILE", "CONVERGE_RELAY_PASSWORD_FILE", "CONVERGE_READER_PASSWORD_FILE", "CONVERGE_PRODUCER_PASSWORD_FILE"},
	},
	"migrate": {postgresRole: roles.Owner, secrets: []string{caSecret, "owner-pgpass"}},
	"streams": {natsUser: natsauth.UserOperator, secrets: []string{caSecret, "nats-operator-password"}},
	"writer": {
		postgresRole: roles.Writer, natsUser: natsauth.UserWriter, tokens: true, tls: true,
		secrets: []string{caSecret, "writer-pgpass", "nats-writer-password", "writer-tokens", "writer-tls-cert", "writer-tls-key"},
	},
	"relay": {
		postgresRole: roles.Relay, natsUser: natsauth.UserRelay, tls: true,
		secrets: []string{caSecret, "relay-pgpass", "nats-relay-password", "relay-tls-cert", "relay-tls-key"},
	},
	"projector-index": {
		natsUser: natsauth.UserIndex, tokens: true, tls: true,
		secrets: []string{caSecret, "nats-projector-index-password", "projector-index-tokens", "projector-index-tls-cert", "projector-index-tls-key", "qdrant-api-key"},
		env:     []string{"CONVERGE_QDRANT_API_KEY_FILE"},
	},
	"projector-graph": {
		natsUser: natsauth.UserGraph, tokens: true, tls: true,
		secrets: []string{caSecret, "nats-projector-graph-password", "projector-graph-tokens", "projector-graph-tls-cert", "projector-graph-tls-key", "neo4j-password"},
		env:     []string{"CONVERGE_NEO4J_USER", "CONVERGE_NEO4J_PASSWORD_FILE"},
	},
	// The notifier serves no API and takes no token; its /metrics has a
	// certificate like every other listener.
	"notifier": {
		natsUser: natsauth.UserNotifier, tls: true,
		secrets: []string{caSecret, "nats-notifier-password", "webhook-secret", "notifier-tls-cert", "notifier-tls-key"},
		env:     []string{"CONVERGE_WEBHOOK_SECRET_FILE"},
	},
}

// vars are the credential variables h gives its service.
func (h holding) vars() []string {
	out := slices.Clone(h.env)
	if h.postgresRole != "" {
		out = append(out, config.EnvPostgresURL)
	}
	if h.natsUser != "" {
		out = append(out, natsauth.EnvUser, natsauth.EnvPassword+"_FILE", natsauth.EnvCA)
	}
	if h.tokens {
		out = append(out, auth.EnvTokensFile)
	}
	if h.tls {
		out = append(out, telemetry.EnvTLSCert, telemetry.EnvTLSKey)
	}
	slices.Sort(out)
	return out
}

// credentialVar matches the names of variables that carry or name a
// credential (or, with _FILE, a file that holds one).
var credentialVar = regexp.MustCompile(`PASSWORD|SECRET|TOKEN|_KEY$|_AUTH$|_USER$|_CREDS$|_NKEY$|PGPASS|^CONVERGE_POSTGRES_URL$`)

func isCredentialVar(env, value string) bool {
	return credentialVar.MatchString(strings.TrimSuffix(env, "_FILE")) || strings.Contains(value, secretsDir)
}

// TestEachServiceHoldsItsOwnCredentials checks docker-compose.yml against
// holdings: each service gets exactly its own credential variables and
// secrets; a Postgres URL names its role and takes the password from a
// mounted pgpass file (never in the URL); the NATS user is the service's
// own and its password a mounted secret (TestSecretsScript checks it is
// the one whose hash nats-server holds); a tokens file is a mounted
// secret.
func TestEachServiceHoldsItsOwnCredentials(t *testing.T) {
	c := loadCompose(t)
	for _, name := range slices.Sorted(maps.Keys(holdings)) {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("holdings names %s, which is not a service of docker-compose.yml", name)
		}
	}
	natsUsers := map[string]string{} // user -> service
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		t.Run(name, func(t *testing.T) {
			h, ok := holdings[name]
			if !ok {
				t.Fatal("not in holdings: say which credentials it may hold")
			}
			var got []string
			for env, v := range s.Environment {
				if secretName.MatchString(env) {
					checkSecretValue(t, name, env, v)
				}
				if isCredentialVar(env, v) {
					got = append(got, env)
				}
				// Every secret a variable names is one of the service's own.
				for _, p := range regexp.MustCompile(regexp.QuoteMeta(secretsDir)+`[\w.-]+`).FindAllString(v, -1) {
					if _, ok := s.secretAt(p); !ok {
						t.Errorf("%s names %s, which is not a secret mounted into it", env, p)
					}
				}
			}
			slices.Sort(got)
			if want := h.vars(); !slices.Equal(got, want) {
				t.Errorf("credential variables %v, want exactly %v", got, want)
			}
			var mounted []string
			for _, r := range s.Secrets {
				mounted = append(mounted, r.Source)
				if _, ok := c.Secrets[r.Source]; !ok {
					t.Errorf("mounts secret %s, which the file's secrets do not define", r.Source)
				}
			}
			slices.Sort(mounted)
			if want := slices.Sorted(slices.Values(h.secrets)); !slices.Equal(mounted, want) {
				t.Errorf("secrets %v, want exactly %v", mounted, want)
			}
			if h.postgresRole != "" {
				checkPostgresURL(t, s, h.postgresRole)
			}
			if _, ok := s.Environment[config.EnvNATSURL]; ok != (h.natsUser != "") {
				t.Errorf("CONVERGE_NATS_URL given: %v; a NATS user in holdings: %q", ok, h.natsUser)
			}
			if h.natsUser != "" {
				if other, ok := natsUsers[h.natsUser]; ok {
					t.Errorf("NATS user %s is %s's too", h.natsUser, other)
				}
				natsUsers[h.natsUser] = name
				checkNATSUser(t, s, h.natsUser)
			}
			if h.tokens {
				if _, ok := s.secretAt(s.Environment[auth.EnvTokensFile]); !ok {
					t.Errorf("%s=%q is not a secret mounted into it", auth.EnvTokensFile, s.Environment[auth.EnvTokensFile])
				}
			}
		})
	}
}

// checkPostgresURL: the service's URL logs in as role, to the postgres
// service, with the password in a pgpass file mounted as a secret.
func checkPostgresURL(t *testing.T, s composeService, role string) {
	t.Helper()
	raw := s.Environment[config.EnvPostgresURL]
	u, err := url.Parse(withDefaults(raw))
	if err != nil || u.User == nil {
		t.Errorf("CONVERGE_POSTGRES_URL %q names no role (%v)", raw, err)
		return
	}
	if u.User.Username() != role {
		t.Errorf("CONVERGE_POSTGRES_URL logs in as %q, want %s", u.User.Username(), role)
	}
	if _, ok := u.User.Password(); ok {
		t.Errorf("CONVERGE_POSTGRES_URL holds its password: take it from a pgpass secret (passfile=%s<name>)", secretsDir)
	}
	if u.Hostname() != "postgres" {
		t.Errorf("CONVERGE_POSTGRES_URL reaches %q, not the postgres service", u.Host)
	}
	if _, ok := s.secretAt(u.Query().Get("passfile")); !ok {
		t.Errorf("CONVERGE_POSTGRES_URL's passfile %q is not a secret mounted into it", u.Query().Get("passfile"))
	}
	// verify-full: TLS, and the server's certificate checked against the
	// stack's CA and for the host name; require or verify-ca would take
	// any server holding a certificate of the CA, or any at all.
	if m := u.Query().Get("sslmode"); m != "verify-full" {
		t.Errorf("CONVERGE_POSTGRES_URL has sslmode=%q, want verify-full", m)
	}
	if name, ok := s.secretAt(u.Query().Get("sslrootcert")); !ok || name != caSecret {
		t.Errorf("CONVERGE_POSTGRES_URL's sslrootcert %q is not the CA's secret %s mounted into it", u.Query().Get("sslrootcert"), caSecret)
	}
}

// checkNATSUser: the service connects as user, with the password of a
// mounted secret and never one written in the file.
func checkNATSUser(t *testing.T, s composeService, user string) {
	t.Helper()
	if got := s.Environment[natsauth.EnvUser]; got != user {
		t.Errorf("%s=%q, want %s", natsauth.EnvUser, got, user)
	}
	if v, ok := s.Environment[natsauth.EnvPassword]; ok {
		t.Errorf("%s=%q: take the password from a mounted secret (%s_FILE)", natsauth.EnvPassword, v, natsauth.EnvPassword)
	}
	if p := s.Environment[natsauth.EnvPassword+"_FILE"]; p == "" {
		t.Errorf("%s_FILE is not set", natsauth.EnvPassword)
	} else if _, ok := s.secretAt(p); !ok {
		t.Errorf("%s_FILE=%q is not a secret mounted into it", natsauth.EnvPassword, p)
	}
}

// TestPostgresRoles: the postgres service runs with wal_level logical and
// is healthy to its superuser; the roles service applies internal/roles
// to it as that superuser, with a password for every role; migrate runs
// after it as the owner, and the writer and the relay wait for both. The
// image's init scripts are not used: the roles service is the one place
// the roles are made.
func TestPostgresRoles(t *testing.T) {
	c := loadCompose(t)
	pg, ok := c.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	if !strings.Contains(strings.Join(pg.Command, " "), "wal_level=logical") {
		t.Error("postgres: not run with -c wal_level=logical")
	}
	if u := withDefaults(pg.Environment["POSTGRES_USER"]); u != "" && u != superuser {
		t.Errorf("postgres: POSTGRES_USER %q, want the image's %s", u, superuser)
	}
	if hc := pg.Healthcheck; !hc.enabled() || !regexp.MustCompile(`(^| )-U `+superuser+`( |$)`).MatchString(strings.Join(hc.Test, " ")) {
		t.Errorf("postgres: the healthcheck does not run as %s", superuser)
	}
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			if v.Target == "/docker-entrypoint-initdb.d" || strings.HasPrefix(v.Target, "/docker-entrypoint-initdb.d/") {
				t.Errorf("%s: mounts %s: the roles service makes the roles", name, v.Target)
			}
		}
	}

	r, ok := c.Services["roles"]
	if !ok {
		t.Fatal("no roles service")
	}
	if !r.fromDockerfile() || !slices.Equal(r.Command, []string{"converge", "roles", "apply"}) {
		t.Errorf("roles: runs %q, want converge roles apply from the image", r.Command)
	}
	if r.DependsOn["postgres"] != "service_healthy" {
		t.Error("roles: does not wait for postgres to be healthy")
	}
	for _, role := range roles.Definition {
		env := rolePasswordEnv(role.Name) + "_FILE"
		if _, ok := r.secretAt(r.Environment[env]); !ok {
			t.Errorf("roles: %s=%q is not a mounted secret: %s would keep no password", env, r.Environment[env], role.Name)
		}
	}

	m := c.Services["migrate"]
	if !slices.Equal(m.Command, []string{"converge", "migrate", "up"}) {
		t.Errorf("migrate: runs %q, want converge migrate up", m.Command)
	}
	if m.DependsOn["roles"] != "service_completed_successfully" {
		t.Error("migrate: does not wait for the roles service to complete")
	}
	for _, name := range []string{"writer", "relay"} {
		for _, dep := range []string{"roles", "migrate"} {
			if c.Services[name].DependsOn[dep] != "service_completed_successfully" {
				t.Errorf("%s: does not wait for %s to complete", name, dep)
			}
		}
	}
}

// rolePasswordEnv is the variable converge roles apply reads role's
// password from: CONVERGE_OWNER_PASSWORD for converge_owner.
func rolePasswordEnv(role string) string {
	return "CONVERGE_" + strings.ToUpper(strings.TrimPrefix(role, "converge_")) + "_PASSWORD"
}

// TestSecretsScript runs deploy/secrets.sh into a fresh directory and
// checks what it makes against docker-compose.yml: every secret the file
// mounts is made; each pgpass file holds the password the roles service
// (or, for the superuser, the postgres service) sets for the role its
// service logs in as; each tokens file lets the operator's token do what
// the operator does there and the client's token no more than a client
// does; a second run changes no value.
func TestSecretsScript(t *testing.T) {
	c := loadCompose(t)
	dir := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, dir)

	hostFile := func(secret string) string {
		spec, ok := c.Secrets[secret]
		if !ok {
			t.Fatalf("secret %s is not defined", secret)
		}
		return filepath.Join(dir, strings.TrimPrefix(path.Clean(spec.File), secretsHostDir+"/"))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Secrets)) {
		spec := c.Secrets[name]
		if path.Dir(path.Clean(spec.File)) != secretsHostDir || spec.External || spec.Environment != "" {
			t.Errorf("secret %s: file %q: want a file of ./%s/, made by %s", name, spec.File, secretsHostDir, secretsScript)
			continue
		}
		info, err := os.Stat(hostFile(name))
		if err != nil {
			t.Errorf("secret %s: %s does not make it: %v", name, secretsScript, err)
			continue
		}
		// Compose mounts the file as it is; the containers' users are not
		// its owner.
		if info.Mode().Perm()&0o004 == 0 {
			t.Errorf("secret %s: mode %v: the services' users cannot read it", name, info.Mode())
		}
	}
	if info, err := os.Stat(dir); err != nil {
		t.Error(err)
	} else if info.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s: mode %v: want the directory its owner's alone", dir, info.Mode())
	}
	secretOf := func(service, env string) string {
		s := c.Services[service]
		name, ok := s.secretAt(s.Environment[env])
		if !ok {
			t.Fatalf("%s: %s names no mounted secret", service, env)
		}
		return readLine(t, hostFile(name))
	}

	password := map[string]string{superuser: secretOf("postgres", "POSTGRES_PASSWORD_FILE")}
	for _, role := range roles.Definition {
		password[role.Name] = secretOf("roles", rolePasswordEnv(role.Name)+"_FILE")
	}
	for _, name := range slices.Sorted(maps.Keys(holdings)) {
		h := holdings[name]
		if h.postgresRole == "" {
			continue
		}
		s := c.Services[name]
		u, err := url.Parse(withDefaults(s.Environment[config.EnvPostgresURL]))
		if err != nil {
			continue // reported by TestEachServiceHoldsItsOwnCredentials
		}
		secret, ok := s.secretAt(u.Query().Get("passfile"))
		if !ok {
			continue
		}
		if got, want := readLine(t, hostFile(secret)), "*:*:*:"+h.postgresRole+":"+password[h.postgresRole]; got != want || password[h.postgresRole] == "" {
			t.Errorf("%s: its pgpass file %s does not hold the password set for %s", name, secret, h.postgresRole)
		}
	}

	operator := readLine(t, filepath.Join(dir, "operator-token"))
	client := readLine(t, filepath.Join(dir, "client-token"))
	if operator == client {
		t.Error("the operator's and the client's tokens are the same")
	}
	for _, tc := range []struct {
		service          string
		operator, client auth.Scope
	}{
		{"writer", auth.Admin | auth.Write, auth.Write},
		{"projector-index", auth.Admin | auth.Read, auth.Read},
		{"projector-graph", auth.Admin | auth.Read, auth.Read},
	} {
		s := c.Services[tc.service]
		secret, ok := s.secretAt(s.Environment[auth.EnvTokensFile])
		if !ok {
			t.Errorf("%s: no tokens file", tc.service)
			continue
		}
		tokens, err := auth.Load(hostFile(secret))
		if err != nil {
			t.Errorf("%s: %v", tc.service, err)
			continue
		}
		g := auth.NewGuard(tokens, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		for _, who := range []struct {
			name, token string
			scopes      auth.Scope
		}{{"operator", operator, tc.operator}, {"client", client, tc.client}} {
			for _, scope := range []auth.Scope{auth.Write, auth.Admin, auth.Read} {
				h := g.Require(scope, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				auth.SetBearer(req.Header, who.token)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if allowed, want := rec.Code == http.StatusOK, who.scopes&scope != 0; allowed != want {
					t.Errorf("%s: the %s's token with scope %s: status %d, want allowed %v", tc.service, who.name, scope, rec.Code, want)
				}
			}
		}
	}

	checkNATSPasswords(t, c, dir, hostFile)
	secretOfService := func(service, secret string) string {
		if !slices.Contains(holdings[service].secrets, secret) {
			t.Fatalf("%s does not hold %s", service, secret)
		}
		return readLine(t, hostFile(secret))
	}
	if v := secretOfService("notifier", "webhook-secret"); len(v) < 32 {
		t.Errorf("the webhook secret %q is short", v)
	}
	qdrantConf := readFileAbs(t, hostFile("qdrant-config"))
	if key := secretOfService("projector-index", "qdrant-api-key"); key == "" || !strings.Contains(qdrantConf, "api_key: "+key+"\n") {
		t.Errorf("qdrant-config does not set the API key projector-index holds:\n%s", qdrantConf)
	}
	if pw := secretOfService("projector-graph", "neo4j-password"); pw == "" || readLine(t, hostFile("neo4j-auth")) != "neo4j/"+pw {
		t.Error("neo4j-auth does not set the password projector-graph holds")
	}

	env := readEnvFile(t, filepath.Join(dir, "operator.env"))
	ca := filepath.Join(dir, "ca.crt")
	if u, err := url.Parse(env[config.EnvPostgresURL]); err != nil || u.User.Username() != roles.Reader ||
		readLine(t, u.Query().Get("passfile")) != "*:*:*:"+roles.Reader+":"+password[roles.Reader] ||
		u.Query().Get("sslmode") != "verify-full" || u.Query().Get("sslrootcert") != ca {
		t.Errorf("operator.env: CONVERGE_POSTGRES_URL %q: want %s with its pgpass file, verify-full against %s (%v)", env[config.EnvPostgresURL], roles.Reader, ca, err)
	}
	if env[natsauth.EnvUser] != natsauth.UserOperator {
		t.Errorf("operator.env: %s=%q, want %s", natsauth.EnvUser, env[natsauth.EnvUser], natsauth.UserOperator)
	}
	if readLine(t, env[natsauth.EnvPassword+"_FILE"]) != readLine(t, hostFile("nats-operator-password")) {
		t.Errorf("operator.env: %s_FILE does not name the operator's NATS password", natsauth.EnvPassword)
	}
	if readLine(t, env[auth.EnvToken+"_FILE"]) != operator {
		t.Errorf("operator.env: %s_FILE does not name the operator's token", auth.EnvToken)
	}
	for _, v := range []string{natsauth.EnvCA, auth.EnvTLSCA} {
		if env[v] != ca {
			t.Errorf("operator.env: %s=%q, want the stack's CA %s", v, env[v], ca)
		}
	}
	for v, port := range map[string]string{"CONVERGE_WRITER_URL": "8080", "CONVERGE_PROJECTOR_INDEX_ADDR": "9103", "CONVERGE_PROJECTOR_GRAPH_ADDR": "9104"} {
		if want := "https://127.0.0.1:" + port; env[v] != want {
			t.Errorf("operator.env: %s=%q, want %s", v, env[v], want)
		}
	}

	before := readDir(t, dir)
	runSecretsScript(t, dir)
	after := readDir(t, dir)
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if after[name] != before[name] {
			t.Errorf("%s: changed by a second run", name)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s: made by the second run only", name)
		}
	}
}

// checkNATSPasswords: the users file the nats service mounts holds exactly
// natsauth's users with exactly their permissions, as the server's own
// parser reads it, and the password each NATS client holds is the one
// whose hash it holds for that client's user.
func checkNATSPasswords(t *testing.T, c composeFile, dir string, hostFile func(string) string) {
	t.Helper()
	usersSecret := ""
	for _, r := range c.Services["nats"].Secrets {
		if r.Target == "/etc/nats/users.conf" {
			usersSecret = r.Source
		}
	}
	if usersSecret == "" {
		t.Fatal("nats: no users file mounted at /etc/nats/users.conf (server.conf includes ./users.conf)")
	}
	opts, err := server.ProcessConfigFile(hostFile(usersSecret))
	if err != nil {
		t.Fatal(err)
	}
	want := natsauth.Permissions()
	hashes := map[string]string{}
	for _, u := range opts.Users {
		hashes[u.Username] = u.Password
		p, ok := want[u.Username]
		if !ok {
			t.Errorf("%s: user %s is not one of natsauth's", usersSecret, u.Username)
			continue
		}
		if err := samePermissions(u.Permissions, p); err != nil {
			t.Errorf("%s: user %s: %v", usersSecret, u.Username, err)
		}
	}
	if got, names := slices.Sorted(maps.Keys(hashes)), slices.Sorted(maps.Keys(want)); !slices.Equal(got, names) {
		t.Errorf("%s: users %v, want those of internal/natsauth %v", usersSecret, got, names)
	}
	if len(opts.Nkeys) > 0 || opts.Username != "" || opts.Authorization != "" || opts.NoAuthUser != "" {
		t.Errorf("%s: another way in besides the users", usersSecret)
	}
	for _, name := range slices.Sorted(maps.Keys(holdings)) {
		h := holdings[name]
		if h.natsUser == "" {
			continue
		}
		s := c.Services[name]
		secret, ok := s.secretAt(s.Environment[natsauth.EnvPassword+"_FILE"])
		if !ok {
			continue // reported by TestEachServiceHoldsItsOwnCredentials
		}
		pw := readLine(t, hostFile(secret))
		if len(pw) < 32 || bcrypt.CompareHashAndPassword([]byte(hashes[h.natsUser]), []byte(pw)) != nil {
			t.Errorf("%s: its NATS password (%s) is not the one whose hash nats-server holds for %s", name, secret, h.natsUser)
		}
	}
}

// samePermissions: got grants exactly what want does, by allow lists alone.
func samePermissions(got, want *server.Permissions) error {
	if got == nil {
		return fmt.Errorf("no permissions: it may do anything")
	}
	if got.Response != nil {
		return fmt.Errorf("allow_responses is set")
	}
	for _, side := range []struct {
		name      string
		got, want *server.SubjectPermission
	}{{"publish", got.Publish, want.Publish}, {"subscribe", got.Subscribe, want.Subscribe}} {
		if side.got == nil {
			return fmt.Errorf("no %s permissions: it may %s anything", side.name, side.name)
		}
		if !slices.Equal(slices.Sorted(slices.Values(side.got.Deny)), slices.Sorted(slices.Values(side.want.Deny))) {
			return fmt.Errorf("%s denies %q, natsauth %q", side.name, side.got.Deny, side.want.Deny)
		}
		if g, w := slices.Sorted(slices.Values(side.got.Allow)), slices.Sorted(slices.Values(side.want.Allow)); !slices.Equal(g, w) {
			return fmt.Errorf("%s allows %q, natsauth %q", side.name, g, w)
		}
	}
	return nil
}

// readDir is every file of dir by name, with its contents and mode.
func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = info.Mode().String() + "\n" + readFileAbs(t, filepath.Join(dir, e.Name()))
	}
	return out
}

func readFileAbs(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func runSecretsScript(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("sh", secretsScript, dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", secretsScript, err, out)
	}
}

// readLine is the first line of the file that is not a comment.
func readLine(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line
		}
	}
	return ""
}

// readEnvFile reads the `export NAME=value` lines of a shell file, values
// unquoted (single quotes) and as written otherwise.
func readEnvFile(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "export ")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		out[k] = strings.Trim(v, "'")
	}
	return out
}
