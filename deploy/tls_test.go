package deploy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"gopkg.in/yaml.v3"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// composeFiles are the Compose files of the repository.
var composeFiles = []string{"docker-compose.yml", "docker-compose.cluster.yml", "docker-compose.test.yml"}

// secretVarName matches the names of variables that hold a secret.
var secretVarName = regexp.MustCompile(`(?i)SECRET|PASSWORD|TOKEN|KEY`)

// TestNoDefaultSecrets: no Compose file gives a secret variable a default
// (${NAME:-value}, ${NAME-value}), anywhere in the file, and no service
// sets one to a value written in the file: a default in a published file
// is a published secret, and a stack started without its own would run
// with it.
func TestNoDefaultSecrets(t *testing.T) {
	for _, file := range composeFiles {
		text := readFile(t, file)
		for _, m := range varRef.FindAllStringSubmatch(text, -1) {
			name := m[1]
			if name != "" && secretVarName.MatchString(name) && (m[2] == ":-" || m[2] == "-") {
				t.Errorf("%s: ${%s%s%s}: a secret variable with a default", file, name, m[2], m[3])
			}
		}
		var c composeFile
		if err := yaml.Unmarshal([]byte(text), &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, name := range slices.Sorted(maps.Keys(c.Services)) {
			for env, v := range c.Services[name].Environment {
				if !secretVarName.MatchString(env) || v == "" {
					continue
				}
				if strings.HasPrefix(v, secretsDir) {
					continue // a mounted secret, or the path of one (CONVERGE_TLS_KEY)
				}
				if file == "docker-compose.test.yml" {
					continue // TestTestServersHoldTestCredentialsOnly
				}
				t.Errorf("%s: %s: %s=%q is written in the file; mount it as a secret (%s_FILE)", file, name, env, v, env)
			}
		}
	}
}

// TestTestServersHoldTestCredentialsOnly: docker-compose.test.yml is the
// one file with a password written in it, the test servers' (make
// test-servers), and it says so; its servers are on loopback alone.
func TestTestServersHoldTestCredentialsOnly(t *testing.T) {
	var c composeFile
	if err := yaml.Unmarshal([]byte(readFile(t, "docker-compose.test.yml")), &c); err != nil {
		t.Fatal(err)
	}
	for name, s := range c.Services {
		for env, v := range s.Environment {
			if isCredentialVar(env, v) && !strings.Contains(v, "converge-test") {
				t.Errorf("%s: %s=%q is not a converge-test credential", name, env, v)
			}
		}
		for _, p := range s.Ports {
			if p.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %q is not on 127.0.0.1", name, p.Raw)
			}
		}
	}
}

// TestServicesUseTLS: every converge service with an HTTP listener serves
// it with a certificate mounted as a secret, and its healthcheck asks it
// over https, verifying it against the stack's CA; every client of NATS
// verifies the server against that CA (CONVERGE_NATS_CA), and every
// Postgres URL is verify-full (checkPostgresURL); the webhook secret comes
// from a file.
func TestServicesUseTLS(t *testing.T) {
	c := loadCompose(t)
	if ca, ok := c.Secrets[caSecret]; !ok || path.Clean(ca.File) != secretsHostDir+"/ca.crt" {
		t.Fatalf("secret %s: %+v, want the file ./%s/ca.crt", caSecret, ca, secretsHostDir)
	}
	oneShots := c.oneShots()
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if !s.fromDockerfile() {
			continue
		}
		t.Run(name, func(t *testing.T) {
			if _, ok := s.Environment[config.EnvNATSURL]; ok {
				if src, ok := s.secretAt(s.Environment[natsauth.EnvCA]); !ok || src != caSecret {
					t.Errorf("%s=%q is not the CA's secret %s mounted into it", natsauth.EnvCA, s.Environment[natsauth.EnvCA], caSecret)
				}
			}
			if oneShots[name] {
				return
			}
			if !holdings[name].tls {
				t.Errorf("%s serves HTTP without a certificate", name)
				return
			}
			for _, env := range []string{telemetry.EnvTLSCert, telemetry.EnvTLSKey} {
				if _, ok := s.secretAt(s.Environment[env]); !ok {
					t.Errorf("%s=%q is not a secret mounted into it", env, s.Environment[env])
				}
			}
			hc := s.Healthcheck.Test
			joined := strings.Join(hc, " ")
			i := slices.Index(hc, "--cacert")
			if !strings.Contains(joined, "https://localhost:") || i < 0 || i+1 >= len(hc) {
				t.Errorf("healthcheck %q: want https://localhost:<port>/readyz verified with --cacert", joined)
			} else if src, ok := s.secretAt(hc[i+1]); !ok || src != caSecret {
				t.Errorf("healthcheck verifies with %s, which is not the CA's secret", hc[i+1])
			}
		})
	}
	n := c.Services["notifier"]
	if v, ok := n.Environment["CONVERGE_WEBHOOK_SECRET"]; ok {
		t.Errorf("notifier: CONVERGE_WEBHOOK_SECRET=%q: take it from the mounted secret (CONVERGE_WEBHOOK_SECRET_FILE)", v)
	}
	if src, ok := n.secretAt(n.Environment["CONVERGE_WEBHOOK_SECRET_FILE"]); !ok || path.Clean(c.Secrets[src].File) != secretsHostDir+"/webhook-secret" {
		t.Errorf("notifier: CONVERGE_WEBHOOK_SECRET_FILE=%q is not the mounted ./%s/webhook-secret", n.Environment["CONVERGE_WEBHOOK_SECRET_FILE"], secretsHostDir)
	}
}

// TestPostgresServesTLS: the postgres service runs with ssl=on, its
// certificate and key from secrets, and the pg_hba.conf of deploy/postgres
// (TestPostgresHBA).
func TestPostgresServesTLS(t *testing.T) {
	pg := loadCompose(t).Services["postgres"]
	settings := map[string]string{}
	for i, a := range pg.Command {
		if a == "-c" && i+1 < len(pg.Command) {
			k, v, _ := strings.Cut(pg.Command[i+1], "=")
			settings[k] = v
		}
	}
	if settings["ssl"] != "on" {
		t.Errorf("postgres: ssl=%q, want on", settings["ssl"])
	}
	if _, ok := pg.secretAt(settings["ssl_cert_file"]); !ok {
		t.Errorf("postgres: ssl_cert_file=%q is not a mounted secret", settings["ssl_cert_file"])
	}
	// The key is a copy of the secret, made for the postgres user, which
	// Postgres requires to own it.
	key := settings["ssl_key_file"]
	if !strings.Contains(strings.Join(pg.Command, " "), "/run/secrets/postgres-tls-key "+key) {
		t.Errorf("postgres: ssl_key_file=%q is not made from the secret postgres-tls-key", key)
	}
	if _, ok := pg.secretAt(secretsDir + "postgres-tls-key"); !ok {
		t.Error("postgres: the secret postgres-tls-key is not mounted")
	}
	mounted := false
	for _, v := range pg.Volumes {
		if path.Clean(v.Source) == "deploy/postgres/pg_hba.conf" && v.Target == settings["hba_file"] {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("postgres: hba_file=%q is not ./deploy/postgres/pg_hba.conf mounted", settings["hba_file"])
	}
}

// hbaLine is one line of pg_hba.conf.
type hbaLine struct {
	typ, method string
	dbs, users  []string
	prefix      netip.Prefix // host lines
	anyAddress  bool
	text        string
}

func readHBA(t *testing.T, file string) []hbaLine {
	t.Helper()
	var out []hbaLine
	sc := bufio.NewScanner(strings.NewReader(readFile(t, file)))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		l := hbaLine{typ: f[0], text: strings.Join(f, " ")}
		switch {
		case l.typ == "local" && len(f) == 4:
			l.dbs, l.users, l.method = strings.Split(f[1], ","), strings.Split(f[2], ","), f[3]
		case strings.HasPrefix(l.typ, "host") && len(f) == 5:
			l.dbs, l.users, l.method = strings.Split(f[1], ","), strings.Split(f[2], ","), f[4]
			if f[3] == "all" {
				l.anyAddress = true
			} else {
				p, err := netip.ParsePrefix(f[3])
				if err != nil {
					t.Fatalf("%s: %q: %v", file, l.text, err)
				}
				l.prefix = p
			}
		default:
			t.Fatalf("%s: %q: not a line this test reads", file, l.text)
		}
		out = append(out, l)
	}
	return out
}

// hbaConn is a connection as pg_hba.conf sees it.
type hbaConn struct {
	ssl      bool
	physical bool // a physical replication connection (database "replication")
	db, user string
	addr     netip.Addr
	local    bool
}

// decide is the method of the first line matching c, as Postgres picks
// it; "reject" when none does.
func decide(lines []hbaLine, c hbaConn) string {
	for _, l := range lines {
		switch {
		case c.local != (l.typ == "local"):
			continue
		case l.typ == "hostssl" && !c.ssl, l.typ == "hostnossl" && c.ssl:
			continue
		case !c.local && !l.anyAddress && !l.prefix.Contains(c.addr):
			continue
		}
		dbOK := slices.ContainsFunc(l.dbs, func(d string) bool {
			if c.physical {
				return d == "replication"
			}
			// A logical replication connection names its database, as
			// any other.
			return d == "all" || d == c.db
		})
		userOK := slices.Contains(l.users, "all") || slices.Contains(l.users, c.user)
		if dbOK && userOK {
			return l.method
		}
	}
	return "reject"
}

// TestPostgresHBA: the stack's pg_hba.conf admits the two REPLICATION
// roles (converge_relay, converge_owner) from the fixed addresses Compose
// gives the relay and migrate alone, admits nobody without TLS, and
// nobody to physical replication; the addresses are those of the
// services, on the network's subnet.
func TestPostgresHBA(t *testing.T) {
	const file = "deploy/postgres/pg_hba.conf"
	c := loadCompose(t)
	var nets struct {
		Networks map[string]struct {
			IPAM struct {
				Config []struct {
					Subnet string `yaml:"subnet"`
				} `yaml:"config"`
			} `yaml:"ipam"`
		} `yaml:"networks"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "docker-compose.yml")), &nets); err != nil {
		t.Fatal(err)
	}
	cfg := nets.Networks["default"].IPAM.Config
	if len(cfg) != 1 {
		t.Fatalf("the default network has %d subnets, want one fixed", len(cfg))
	}
	subnet, err := netip.ParsePrefix(cfg[0].Subnet)
	if err != nil {
		t.Fatal(err)
	}
	fixed := func(service string) netip.Addr {
		a, err := netip.ParseAddr(c.Services[service].Networks["default"].IPv4Address)
		if err != nil || !subnet.Contains(a) {
			t.Fatalf("%s: ipv4_address %q is not a fixed address of %s (%v)", service, c.Services[service].Networks["default"].IPv4Address, subnet, err)
		}
		return a
	}
	relay, owner := fixed("relay"), fixed("migrate")
	other := subnet.Addr().Next().Next().Next() // another container of the network
	if other == relay || other == owner {
		t.Fatalf("pick another address than %s", other)
	}
	host := netip.MustParseAddr("203.0.113.7")

	lines := readHBA(t, file)
	for _, tc := range []struct {
		what string
		conn hbaConn
		want string
	}{
		{"the relay, from its address, over TLS", hbaConn{ssl: true, db: "converge", user: "converge_relay", addr: relay}, "scram-sha-256"},
		{"the relay from another container", hbaConn{ssl: true, db: "converge", user: "converge_relay", addr: other}, "reject"},
		{"the relay without TLS", hbaConn{db: "converge", user: "converge_relay", addr: relay}, "reject"},
		{"the relay to another database", hbaConn{ssl: true, db: "postgres", user: "converge_relay", addr: relay}, "reject"},
		{"the relay, physical replication", hbaConn{ssl: true, physical: true, user: "converge_relay", addr: relay}, "reject"},
		{"migrate, from its address", hbaConn{ssl: true, db: "converge", user: "converge_owner", addr: owner}, "scram-sha-256"},
		{"the owner from another container", hbaConn{ssl: true, db: "converge", user: "converge_owner", addr: other}, "reject"},
		{"the owner from the relay's address", hbaConn{ssl: true, db: "converge", user: "converge_owner", addr: relay}, "reject"},
		{"the writer, over TLS", hbaConn{ssl: true, db: "converge", user: "converge_writer", addr: other}, "scram-sha-256"},
		{"the writer without TLS", hbaConn{db: "converge", user: "converge_writer", addr: other}, "reject"},
		{"the reader from the host, over TLS", hbaConn{ssl: true, db: "converge", user: "converge_reader", addr: host}, "scram-sha-256"},
		{"the reader to another database", hbaConn{ssl: true, db: "postgres", user: "converge_reader", addr: host}, "reject"},
		{"the superuser, over TLS", hbaConn{ssl: true, db: "postgres", user: "postgres", addr: other}, "scram-sha-256"},
		{"the superuser without TLS", hbaConn{db: "postgres", user: "postgres", addr: other}, "reject"},
		{"the superuser, physical replication", hbaConn{ssl: true, physical: true, user: "postgres", addr: other}, "reject"},
		{"anyone else, over TLS", hbaConn{ssl: true, db: "converge", user: "mallory", addr: other}, "reject"},
		{"anyone, physical replication", hbaConn{ssl: true, physical: true, user: "replicator", addr: relay}, "reject"},
		{"a converge role over the socket", hbaConn{local: true, db: "converge", user: "converge_writer"}, "reject"},
	} {
		if got := decide(lines, tc.conn); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.what, got, tc.want)
		}
	}
	// converge's roles' lines are those `converge roles apply` prints for
	// the addresses the roles service gives it, which are the relay's and
	// migrate's.
	r := c.Services["roles"]
	if r.Environment["CONVERGE_RELAY_ADDR"] != relay.String() || r.Environment["CONVERGE_OWNER_ADDR"] != owner.String() {
		t.Errorf("roles: CONVERGE_RELAY_ADDR=%q, CONVERGE_OWNER_ADDR=%q, want the relay's %s and migrate's %s",
			r.Environment["CONVERGE_RELAY_ADDR"], r.Environment["CONVERGE_OWNER_ADDR"], relay, owner)
	}
	want, err := roles.HBA(roles.HBAOptions{RelayAddress: relay.String(), OwnerAddress: owner.String()})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		got := "(none)"
		if i < len(lines) {
			got = lines[i].text
		}
		if got != strings.Join(strings.Fields(w.Line), " ") {
			t.Errorf("%s: line %d is %q, want %q, as converge roles apply prints it (%s)", file, i+1, got, w.Line, w.Why)
		}
	}
	for _, l := range lines {
		if l.typ == "host" || l.typ == "hostnossl" {
			if l.method != "reject" {
				t.Errorf("%s: %q admits connections without TLS", file, l.text)
			}
		}
	}
}

// TestSecretsScriptCertificates runs deploy/secrets.sh and checks each
// certificate the stack mounts: it chains to the CA the clients hold, its
// key is its own, and it is valid for every name its service is reached
// by: the service's name, each host name that clients use for it in the
// Compose files, localhost and 127.0.0.1.
func TestSecretsScriptCertificates(t *testing.T) {
	c := loadCompose(t)
	dir := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, dir)
	hostFile := func(secret string) string {
		return filepath.Join(dir, strings.TrimPrefix(path.Clean(c.Secrets[secret].File), secretsHostDir+"/"))
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(readFileAbs(t, hostFile(caSecret)))) {
		t.Fatal("the CA's secret holds no certificate")
	}

	// names: the names each server is reached by, by its certificate's
	// secret.
	names := map[string][]string{
		"postgres-tls-cert": {"postgres"},
		"nats-tls-cert":     {"nats", "nats-2", "nats-3"},
	}
	keys := map[string]string{"postgres-tls-cert": "postgres-tls-key", "nats-tls-cert": "nats-tls-key"}
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if certSecret, ok := s.secretAt(s.Environment[telemetry.EnvTLSCert]); ok {
			names[certSecret] = append(names[certSecret], name)
			keys[certSecret], _ = s.secretAt(s.Environment[telemetry.EnvTLSKey])
		}
	}
	// The host names clients use, from their URLs: each must be in the
	// certificate of the server it names.
	var cluster composeFile
	if err := yaml.Unmarshal([]byte(readFile(t, "docker-compose.cluster.yml")), &cluster); err != nil {
		t.Fatal(err)
	}
	for _, f := range []composeFile{c, cluster} {
		for _, s := range f.Services {
			for _, raw := range strings.Split(s.Environment[config.EnvNATSURL], ",") {
				if u, err := url.Parse(raw); err == nil && u.Hostname() != "" && !slices.Contains(names["nats-tls-cert"], u.Hostname()) {
					t.Errorf("NATS URL %q: host %s is not among the NATS certificate's names %v", raw, u.Hostname(), names["nats-tls-cert"])
				}
			}
			if u, err := url.Parse(s.Environment[config.EnvPostgresURL]); err == nil && u.Hostname() != "" && u.Hostname() != "postgres" {
				t.Errorf("Postgres URL reaches %s, which is not among the Postgres certificate's names", u.Hostname())
			}
		}
	}
	if len(names) < 6 {
		t.Errorf("certificates %v: want Postgres', NATS' and one per converge service with an HTTP listener", slices.Sorted(maps.Keys(names)))
	}
	for _, certSecret := range slices.Sorted(maps.Keys(names)) {
		pair, err := tls.LoadX509KeyPair(hostFile(certSecret), hostFile(keys[certSecret]))
		if err != nil {
			t.Errorf("%s with %s: %v", certSecret, keys[certSecret], err)
			continue
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, host := range append(slices.Clone(names[certSecret]), "localhost", "127.0.0.1") {
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("%s, for %s: %v", certSecret, host, err)
			}
		}
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: "converge.example", Roots: roots}); err == nil {
			t.Errorf("%s is valid for a name no service has", certSecret)
		}
		if left := time.Until(cert.NotAfter); left < 90*24*time.Hour {
			t.Errorf("%s: ends in %v", certSecret, left)
		}
	}
	// The NATS nodes present their certificate to each other.
	if cert := parseCert(t, hostFile("nats-tls-cert")); !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Error("nats-tls-cert: not for client authentication, which the cluster's routes verify")
	}
	// Postgres reads the key as OpenSSL does: PEM, PKCS #8.
	if b, _ := pem.Decode([]byte(readFileAbs(t, hostFile("postgres-tls-key")))); b == nil || b.Type != "PRIVATE KEY" {
		t.Error("postgres-tls-key: not a PEM PKCS #8 key")
	}
	if info, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v %v: want its owner's alone", info.Mode(), err)
	}
	for _, spec := range c.Secrets {
		if path.Base(spec.File) == "ca.key" {
			t.Error("the CA's key is mounted into the stack")
		}
	}
}

func parseCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode([]byte(readFileAbs(t, file)))
	if b == nil {
		t.Fatalf("%s: not PEM", file)
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// natsStackConf writes the nats service's configuration as it runs in its
// container into a new directory, with deploy/secrets.sh's files: every
// file the service mounts at its target, the store on a temporary
// directory. It returns the path of the configuration file.
func natsStackConf(t *testing.T, c composeFile, secrets string, confs ...string) string {
	t.Helper()
	dir := t.TempDir()
	nats := c.Services["nats"]
	replace := []string{"store_dir: /data", "store_dir: " + filepath.Join(dir, "data")}
	for _, r := range nats.Secrets {
		host := filepath.Join(secrets, strings.TrimPrefix(path.Clean(c.Secrets[r.Source].File), secretsHostDir+"/"))
		if strings.HasPrefix(r.Target, secretsDir) {
			replace = append(replace, r.Target, host)
		} else if r.Target == "/etc/nats/users.conf" {
			if err := os.WriteFile(filepath.Join(dir, "users.conf"), []byte(readFileAbs(t, host)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	replace = append(replace, secretsDir+caSecret, filepath.Join(secrets, "ca.crt"))
	r := strings.NewReplacer(replace...)
	for _, conf := range confs {
		if err := os.WriteFile(filepath.Join(dir, path.Base(conf)), []byte(r.Replace(readFile(t, conf))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, path.Base(confs[len(confs)-1]))
}

// TestNATSRequiresTLS runs the nats service's configuration with the files
// of deploy/secrets.sh: the server says TLS is required before anything
// else; a service connecting as natsauth's client does, with the CA and
// its mounted password, gets in; a wrong password or an unknown CA does
// not. The configurations Compose mounts hold no password hash.
func TestNATSRequiresTLS(t *testing.T) {
	c := loadCompose(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, secrets)
	conf := natsStackConf(t, c, secrets, natsServerConf)
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	addr := ns.Addr().String()

	// Before any byte from the client, the server's INFO says TLS is
	// required: a client that does not start TLS is refused.
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	info, err := bufio.NewReader(conn).ReadString('\n')
	_ = conn.Close()
	if err != nil || !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("the server's INFO %q (%v) does not require TLS", info, err)
	}

	writer := c.Services["writer"]
	pwSecret, _ := writer.secretAt(writer.Environment[natsauth.EnvPassword+"_FILE"])
	password := readLine(t, filepath.Join(secrets, strings.TrimPrefix(path.Clean(c.Secrets[pwSecret].File), secretsHostDir+"/")))
	connect := func(cc natsauth.ClientConfig) error {
		o, err := cc.Options()
		if err != nil {
			return err
		}
		nc, err := nats.Connect("nats://"+addr, append(o, nats.Timeout(5*time.Second), nats.NoReconnect())...)
		if err != nil {
			return err
		}
		defer nc.Close()
		return nc.Flush()
	}
	ca := filepath.Join(secrets, "ca.crt")
	if err := connect(natsauth.ClientConfig{User: natsauth.UserWriter, Password: password, CAFile: ca}); err != nil {
		t.Errorf("the writer, with its password and the CA: %v", err)
	}
	if err := connect(natsauth.ClientConfig{User: natsauth.UserWriter, Password: "converge-local-writer", CAFile: ca}); err == nil {
		t.Error("the writer got in with the old published password")
	}
	otherCA := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, otherCA)
	if err := connect(natsauth.ClientConfig{User: natsauth.UserWriter, Password: password, CAFile: filepath.Join(otherCA, "ca.crt")}); err == nil {
		t.Error("the writer trusted a server whose certificate another CA signed")
	}

	hash := regexp.MustCompile(`\$2[abxy]?\$\d\d\$`)
	for _, f := range []string{natsServerConf, natsClusterConf} {
		if text := readFile(t, f); hash.MatchString(text) || regexp.MustCompile(`(?m)^\s*password\s*[:=]`).MatchString(text) {
			t.Errorf("%s holds a password or its hash: the users come from deploy/secrets/nats-users.conf", f)
		}
	}
	for _, f := range []string{"docker-compose.yml", "docker-compose.cluster.yml"} {
		if strings.Contains(readFile(t, f), "deploy/nats/converge.conf") {
			t.Errorf("%s mounts deploy/nats/converge.conf, whose hashes are of published passwords", f)
		}
	}
	if mp := opts.MaxPayload; int64(mp) < contract.MaxMessageBytes {
		t.Errorf("%s: max_payload %d is below %d bytes, the largest event", natsServerConf, mp, contract.MaxMessageBytes)
	}
	if !opts.JetStream {
		t.Errorf("%s: JetStream is not enabled", natsServerConf)
	}
}
