package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnableTLS makes the cluster accept TLS with certs' key pair until t
// ends (ssl = on, by ALTER SYSTEM and a reload: no restart). The key pair
// is copied into the data directory, owned by the server's user, as the
// server requires of its key. Connections without TLS are still accepted
// (sslmode=disable, the URLs of Cluster.URL); VerifyFullURL gives one that
// requires TLS and verifies the server. It returns once a connection with
// sslmode=verify-full succeeds.
func (p *Postgres) EnableTLS(t testing.TB, certs Certificates) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var dataDir string
	if err := p.admin.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	info, err := os.Stat(dataDir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	owner, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("testenv: no owner of %s", dataDir)
	}
	// Names of their own: the files of another run's EnableTLS are
	// overwritten, never those of the cluster.
	files := map[string]string{"converge-test-server.crt": certs.CertFile, "converge-test-server.key": certs.KeyFile}
	for name, from := range files {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		to := filepath.Join(dataDir, name)
		if err := os.WriteFile(to, data, 0o600); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err := os.Chown(to, int(owner.Uid), int(owner.Gid)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	set := func(statements ...string) error {
		for _, s := range statements {
			if _, err := p.admin.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	if err := set("ALTER SYSTEM SET ssl_cert_file = 'converge-test-server.crt'",
		"ALTER SYSTEM SET ssl_key_file = 'converge-test-server.key'",
		"ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		for _, s := range []string{"ALTER SYSTEM RESET ssl", "ALTER SYSTEM RESET ssl_cert_file",
			"ALTER SYSTEM RESET ssl_key_file", "SELECT pg_reload_conf()"} {
			if _, err := p.admin.Exec(ctx, s); err != nil {
				t.Errorf("testenv: %s: %v", s, err)
			}
		}
	})
	// The postmaster reloads asynchronously: until it has, a connection
	// that requires TLS is refused.
	check := VerifyFullURL(p.Cluster.URL("postgres"), certs.CAFile)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, check)
		if err == nil {
			_ = conn.Close(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: Postgres with TLS: %v (see the server's log)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// VerifyFullURL is the Postgres URL u with sslmode=verify-full and
// sslrootcert=caFile: a connection by it is over TLS, to a server whose
// certificate caFile's CA signed for u's host.
func VerifyFullURL(u, caFile string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return u // not a URL: the connection fails and says why
	}
	q := parsed.Query()
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", caFile)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}
