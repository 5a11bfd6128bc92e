//go:build linux

package roles_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/roles"
)

// The pg_hba.conf lines of roles.HBA, put above lines that trust every
// connection, admit the relay from its address alone, over TLS, with its
// password, to converge's database (its queries and its logical
// replication stream), and refuse it from another address, without TLS,
// to another database, and for physical replication; the owner likewise;
// the writer from any address, to converge's database alone. The cluster
// is the test's own (it changes the server's TLS and pg_hba.conf); Linux
// routes all of 127.0.0.0/8 to loopback, so a connection can come from
// 127.0.0.2 (the relay's address) or 127.0.0.3 (another host).
func TestHBALinesAdmitEachRoleWhereItRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	const relayAddr, ownerAddr, elsewhere = "127.0.0.2", "127.0.0.4", "127.0.0.3"
	passwords := map[string]string{roles.Relay: "relay-password-1", roles.Owner: "owner-password-2", roles.Writer: "writer-password-3"}
	apply(t, c.URL("postgres"), roles.Options{Passwords: passwords})

	lines, err := roles.HBA(roles.HBAOptions{RelayAddress: relayAddr, OwnerAddress: ownerAddr})
	if err != nil {
		t.Fatal(err)
	}
	var hba strings.Builder
	for _, l := range lines {
		hba.WriteString(l.Line + "\n")
	}
	// Below them, what a permissive file holds: they must decide alone.
	hba.WriteString("local all all trust\nhost all all all trust\nlocal replication all trust\nhost replication all all trust\n")
	serveTLS(t, c)
	reloadHBA(t, c, hba.String())

	type attempt struct {
		role, from, database, replication, sslmode, password string
		admitted                                             bool
		code, message                                        string // of the refusal
	}
	rejects := func(role, from, database string) string {
		ssl := "SSL encryption"
		if database == "replication connection" {
			return fmt.Sprintf(`pg_hba.conf rejects replication connection for host "%s", user "%s", %s`, from, role, ssl)
		}
		return fmt.Sprintf(`pg_hba.conf rejects connection for host "%s", user "%s", database "%s", %s`, from, role, database, ssl)
	}
	ok := func(role, from, database, replication string) attempt {
		return attempt{role: role, from: from, database: database, replication: replication, sslmode: "require", password: passwords[role], admitted: true}
	}
	no := func(role, from, database, replication string) attempt {
		what := database
		if replication == "true" {
			what = "replication connection"
		}
		return attempt{role: role, from: from, database: database, replication: replication, sslmode: "require", password: passwords[role],
			code: pgerrcode.InvalidAuthorizationSpecification, message: rejects(role, from, what)}
	}
	db := roles.DefaultDatabase
	plain := no(roles.Relay, relayAddr, db, "")
	plain.sslmode, plain.message = "disable", strings.Replace(plain.message, "SSL encryption", "no encryption", 1)
	wrongPassword := ok(roles.Relay, relayAddr, db, "")
	wrongPassword.password, wrongPassword.admitted = "not-the-relays", false
	wrongPassword.code, wrongPassword.message = pgerrcode.InvalidPassword, `password authentication failed for user "converge_relay"`
	for _, a := range []attempt{
		ok(roles.Relay, relayAddr, db, ""),
		ok(roles.Relay, relayAddr, db, "database"),
		no(roles.Relay, elsewhere, db, ""),
		no(roles.Relay, elsewhere, db, "database"),
		no(roles.Relay, relayAddr, "postgres", ""),
		no(roles.Relay, relayAddr, "postgres", "database"),
		no(roles.Relay, relayAddr, db, "true"),
		plain,
		wrongPassword,
		ok(roles.Owner, ownerAddr, db, ""),
		no(roles.Owner, relayAddr, db, ""),
		no(roles.Owner, ownerAddr, db, "true"),
		ok(roles.Writer, elsewhere, db, ""),
		no(roles.Writer, elsewhere, "postgres", ""),
	} {
		what := fmt.Sprintf("%s from %s to %s (replication=%q, sslmode=%s)", a.role, a.from, a.database, a.replication, a.sslmode)
		conn, err := connectFrom(ctx, c, a.from, a.role, a.password, a.database, a.replication, a.sslmode)
		if a.admitted {
			if err != nil {
				t.Errorf("%s: %v, want admitted", what, err)
				continue
			}
			t.Logf("%s: admitted", what)
			_ = conn.Close(ctx)
			continue
		}
		if err == nil {
			_ = conn.Close(ctx)
		}
		refused(t, what, err, a.code, a.message)
	}

	// What the lines cannot limit: the connection they admit for the
	// relay's stream also takes a base backup of the whole cluster.
	walsender, err := connectFrom(ctx, c, relayAddr, roles.Relay, passwords[roles.Relay], db, "database", "require")
	if err != nil {
		t.Fatal(err)
	}
	defer walsender.Close(ctx)
	if _, err := pglogrepl.StartBaseBackup(ctx, walsender, pglogrepl.BaseBackupOptions{Label: "not the relay's", Fast: true}); err != nil {
		t.Errorf("BASE_BACKUP over the relay's admitted stream connection: %v; docs/security.md says the lines do not stop it", err)
	}
}

// connectFrom connects to c from the local address from.
func connectFrom(ctx context.Context, c *pgcluster.Cluster, from, role, password, database, replication, sslmode string) (*pgconn.PgConn, error) {
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user='%s' password='%s' dbname='%s' sslmode=%s connect_timeout=10", c.Port(), role, password, database, sslmode)
	if replication != "" {
		dsn += " replication=" + replication
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	cfg.DialFunc = dialer.DialContext
	cfg.Fallbacks = nil // sslmode=require: no attempt without TLS after a refusal
	return pgconn.ConnectConfig(ctx, cfg)
}

// serveTLS gives c a self-signed certificate and turns TLS on.
func serveTLS(t *testing.T, c *pgcluster.Cluster) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{"server.crt": {Type: "CERTIFICATE", Bytes: der}, "server.key": {Type: "PRIVATE KEY", Bytes: keyDER}} {
		writeAsServer(t, c, name, pem.EncodeToMemory(block))
	}
	admin := adminConn(t, c)
	for _, sql := range []string{`ALTER SYSTEM SET ssl = on`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// reloadMarker is a role no cluster has; the first line of pg_hba.conf
// refuses it, so its refusal says that the file is in force.
const reloadMarker = "converge_reload_marker"

// reloadHBA replaces c's pg_hba.conf with text (after the marker's line), checks that the server
// parses every line, and reloads it.
func reloadHBA(t *testing.T, c *pgcluster.Cluster, text string) {
	t.Helper()
	writeAsServer(t, c, "pg_hba.conf", []byte("host all "+reloadMarker+" all reject\n"+text))
	admin := adminConn(t, c)
	ctx := context.Background()
	var bad []string
	rows, err := admin.Query(ctx, `SELECT line_number || ': ' || error FROM pg_hba_file_rules WHERE error IS NOT NULL`)
	if err == nil {
		bad, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(bad) > 0 {
		t.Fatalf("pg_hba.conf:\n%s\nlines in error: %v %v", text, bad, err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	// The reload is asynchronous: wait until the postmaster refuses the
	// marker's role (which does not exist) by the file's first line.
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := connectFrom(ctx, c, "127.0.0.1", reloadMarker, "", "postgres", "", "disable")
		if err == nil {
			_ = conn.Close(ctx)
		} else if strings.Contains(err.Error(), "pg_hba.conf rejects") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_hba.conf not in force 30 s after the reload: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adminConn is the superuser's connection over the Unix socket.
func adminConn(t *testing.T, c *pgcluster.Cluster) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// writeAsServer writes name in c's data directory, owned by the data
// directory's owner (the server's OS user, when the test runs as root).
func writeAsServer(t *testing.T, c *pgcluster.Cluster, name string, data []byte) {
	t.Helper()
	path := filepath.Join(c.DataDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(c.DataDir())
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatal(errors.New("no owner of the data directory"))
	}
	if err := os.Chown(path, int(st.Uid), int(st.Gid)); err != nil {
		t.Fatal(err)
	}
}
