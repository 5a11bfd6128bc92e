package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func startCluster(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

func connect(t *testing.T, c *Cluster) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func show(t *testing.T, conn *pgx.Conn, name string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(t.Context(), "SHOW "+name).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", name, err)
	}
	return v
}

// accessibleTempDir returns a test temp dir the postgres OS user can enter
// when tests run as root (t.TempDir is mode 0700).
func accessibleTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for p := d; p != filepath.Dir(p) && strings.HasPrefix(p, os.TempDir()) && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestStartSettingsAndConnect(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Config{Settings: map[string]string{
		"max_connections": "50",                   // overrides a default
		"cluster_name":    `it's a "test" \ here`, // needs quoting in postgresql.conf
	}})
	conn := connect(t, c)

	want := map[string]string{
		"wal_level":             "logical",
		"listen_addresses":      "127.0.0.1",
		"max_connections":       "50",
		"max_replication_slots": "10",
		"max_wal_senders":       "10",
		"fsync":                 "off",
		"synchronous_commit":    "on",
		"cluster_name":          `it's a "test" \ here`,
		"port":                  fmt.Sprint(c.Port()),
	}
	for name, v := range want {
		if got := show(t, conn, name); got != v {
			t.Errorf("SHOW %s = %q, want %q", name, got, v)
		}
	}
	if got := show(t, conn, "unix_socket_directories"); !strings.HasPrefix(got, os.TempDir()) {
		t.Errorf("unix_socket_directories = %q, want a private dir under %s", got, os.TempDir())
	}

	wantURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/app?sslmode=disable", c.Port())
	if got := c.URL("app"); got != wantURL {
		t.Errorf("URL = %q, want %q", got, wantURL)
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Errorf("data dir not initialised: %v", err)
	}
	var user string
	if err := conn.QueryRow(t.Context(), "SELECT current_user").Scan(&user); err != nil || user != "postgres" {
		t.Errorf("current_user = %q, %v; want postgres", user, err)
	}
}

func TestListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Config{})
	port := fmt.Sprint(c.Port())

	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 2*time.Second)
	if err != nil {
		t.Fatalf("dial 127.0.0.1: %v", err)
	}
	conn.Close()

	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		host := ipn.IP.String()
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 2*time.Second); err == nil {
			conn.Close()
			t.Errorf("server reachable on non-loopback address %s", host)
		}
		checked++
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("::1", port), 2*time.Second); err == nil {
		conn.Close()
		t.Errorf("server reachable on ::1; want 127.0.0.1 only")
	}
	t.Logf("checked %d non-loopback addresses", checked)
}

func TestKillRestartStopLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	port, root := c.Port(), filepath.Dir(c.DataDir())

	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func() int {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}

	exec("CREATE TABLE items (id int PRIMARY KEY)")
	exec("INSERT INTO items SELECT generate_series(1, 100)")
	pid := c.pid()
	if !processAlive(pid) {
		t.Fatalf("postmaster pid %d not alive", pid)
	}

	// Crash: committed rows must survive crash recovery.
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if processAlive(pid) {
		t.Fatalf("postmaster %d still alive after Kill", pid)
	}
	if _, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
		t.Fatal("connected to a killed server")
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart after Kill: %v", err)
	}
	if c.Port() != port {
		t.Fatalf("port changed on restart: %d -> %d", port, c.Port())
	}
	if n := count(); n != 100 {
		t.Fatalf("after Kill+Restart: %d rows, want 100", n)
	}
	logData, _ := os.ReadFile(filepath.Join(root, "postgres.log"))
	if !strings.Contains(string(logData), "not properly shut down") {
		t.Errorf("expected crash recovery in server log, got:\n%s", lastLines(logData, 20))
	}

	// Clean stop with data kept.
	exec("INSERT INTO items VALUES (101)")
	if err := c.StopKeep(ctx); err != nil {
		t.Fatalf("StopKeep: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Fatalf("data dir gone after StopKeep: %v", err)
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart after StopKeep: %v", err)
	}
	if n := count(); n != 101 {
		t.Fatalf("after StopKeep+Restart: %d rows, want 101", n)
	}

	// Restart while running is a stop+start.
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart while running: %v", err)
	}
	if n := count(); n != 101 {
		t.Fatalf("after running Restart: %d rows, want 101", n)
	}

	pid = c.pid()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if processAlive(pid) {
		t.Errorf("postmaster %d still alive after Stop", pid)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s not removed by Stop (stat err %v)", root, err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := c.Restart(ctx); !errors.Is(err, ErrRemoved) {
		t.Errorf("Restart after Stop: err = %v, want ErrRemoved", err)
	}
}

func TestReuseExplicitDir(t *testing.T) {
	t.Parallel()
	dir := accessibleTempDir(t)
	ctx := t.Context()

	c1, err := Start(ctx, Config{Dir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	conn, err := pgx.Connect(ctx, c1.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('x')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := c1.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		t.Fatalf("Stop removed a caller-provided Dir: %v", err)
	}

	c2 := startCluster(t, Config{Dir: dir})
	var v string
	if err := connect(t, c2).QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "x" {
		t.Fatalf("reused cluster: v=%q err=%v, want x", v, err)
	}
	confData, err := os.ReadFile(filepath.Join(dir, "data", "postgresql.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(confData), "include_if_exists = 'converge.conf'"); n != 1 {
		t.Errorf("include line appears %d times in postgresql.conf, want 1", n)
	}
}

func TestBogusBinDir(t *testing.T) {
	t.Parallel()
	bogus := filepath.Join(t.TempDir(), "no-such-bin")
	_, err := Start(t.Context(), Config{BinDir: bogus})
	if !errors.Is(err, ErrBinariesNotFound) {
		t.Fatalf("err = %v, want ErrBinariesNotFound", err)
	}
	for _, s := range []string{bogus, "apt-get install postgresql-15", "CONVERGE_PG_BINDIR"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestEnvBinDirIsAuthoritative(t *testing.T) {
	bogus := filepath.Join(t.TempDir(), "nope")
	t.Setenv(EnvBinDir, bogus)
	_, err := FindBinDir("")
	if !errors.Is(err, ErrBinariesNotFound) || !strings.Contains(err.Error(), bogus) {
		t.Fatalf("FindBinDir with bogus $%s: err = %v", EnvBinDir, err)
	}
}

func TestFindBinDirDefault(t *testing.T) {
	t.Parallel()
	if os.Getenv(EnvBinDir) != "" {
		t.Skip(EnvBinDir + " is set")
	}
	dir, err := FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range requiredBinaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s missing from %s", name, dir)
		}
	}
}

func TestInvalidSettings(t *testing.T) {
	t.Parallel()
	for _, s := range []map[string]string{
		{"port": "5432"},
		{"bad name\nfsync": "on"},
	} {
		if _, err := Start(t.Context(), Config{Settings: s}); err == nil {
			t.Errorf("Start with settings %q succeeded, want error", s)
		}
	}
}

// holdPort keeps a port busy on 127.0.0.1 for the rest of the test.
func holdPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

func TestRetriesWhenPickedPortIsTaken(t *testing.T) {
	taken := holdPort(t)
	calls := 0
	pickPort = func() (int, error) {
		calls++
		if calls == 1 {
			return taken, nil // lost the race: someone bound it after we picked it
		}
		return freePort()
	}
	t.Cleanup(func() { pickPort = freePort })

	c := startCluster(t, Config{})
	if c.Port() == taken {
		t.Fatalf("cluster claims taken port %d", taken)
	}
	if calls < 2 {
		t.Fatalf("pickPort called %d times, want a retry", calls)
	}
	connect(t, c)
}

func TestFixedPortTakenFailsCleanly(t *testing.T) {
	tmp := accessibleTempDir(t)
	t.Setenv("TMPDIR", tmp) // so the cluster's temp dir is observable
	taken := holdPort(t)

	_, err := Start(t.Context(), Config{Port: taken})
	var se *StartError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want *StartError", err)
	}
	if se.Port != taken || !strings.Contains(se.LogTail, "could not bind") {
		t.Errorf("StartError port=%d log tail=%q; want port %d and a bind failure", se.Port, se.LogTail, taken)
	}
	if !strings.Contains(err.Error(), "server log tail") {
		t.Errorf("error message lacks the log tail: %v", err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("failed Start left %d entries in temp dir (first %s)", len(entries), entries[0].Name())
	}
}

func TestQuoteConf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain":   "'plain'",
		"it's":    "'it''s'",
		`a\b`:     `'a\\b'`,
		"l1\nl2":  `'l1\nl2'`,
		"a b, c":  "'a b, c'",
		"":        "''",
		"$user,x": "'$user,x'",
	} {
		if got := quoteConf(in); got != want {
			t.Errorf("quoteConf(%q) = %s, want %s", in, got, want)
		}
	}
}
