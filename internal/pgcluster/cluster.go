package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/localaddr"
)

// Config describes the cluster to start. The zero value is usable.
type Config struct {
	// BinDir holds initdb, pg_ctl and postgres. Empty: $CONVERGE_PG_BINDIR,
	// else `pg_config --bindir`, else initdb on $PATH, else the newest
	// /usr/lib/postgresql/*/bin.
	BinDir string
	// Dir is the parent directory of the cluster (data/, run/,
	// postgres.log). Empty: a fresh temporary directory that Stop removes.
	// A Dir that already holds an initialised cluster is reused as is.
	Dir string
	// Port is the TCP port on 127.0.0.1. 0 picks a free one, retrying with
	// another port if it is taken before the server binds it.
	Port int
	// Settings are extra postgresql.conf settings; they override the
	// defaults. "port" is not allowed here: use Port.
	Settings map[string]string
	// Logger receives lifecycle events; nil discards them.
	Logger *slog.Logger
	// NoWatchdog disables the owner watchdog. By default a small detached
	// process (/bin/sh, on Unix) notices within moments when this process
	// exits without Stop (a panic, a test timeout, SIGKILL), then stops the
	// server in immediate mode and removes the directories Start created as
	// temporary ones; a caller-provided Dir is never removed. Disable it
	// only when the server must outlive this process.
	NoWatchdog bool
}

// Cluster is a running (or stopped) local PostgreSQL server. Its methods are
// safe for concurrent use.
type Cluster struct {
	binDir   string
	root     string
	dataDir  string
	sockDir  string
	logFile  string
	port     int
	temp     bool // root was created by Start and is removed by Stop
	sockTemp bool // sockDir lives outside root because root's path is too long
	as       *runAs
	log      *slog.Logger

	noWatchdog bool

	mu      sync.Mutex
	running bool
	removed bool
	wd      *watchdog // guards what the cluster owns if this process dies
}

const (
	// maxPortAttempts bounds retries when a picked port is grabbed by
	// someone else between picking and binding it.
	maxPortAttempts = 5
	// pgCtlWaitSeconds is pg_ctl's own -t; ctx may end the wait earlier.
	pgCtlWaitSeconds = "60"
	// readyTimeout bounds the pgx readiness check after pg_ctl -w succeeded.
	readyTimeout = 30 * time.Second
	// stopTimeout bounds stops that have no caller context (Kill, cleanup).
	stopTimeout = 60 * time.Second
	// maxSocketPath keeps room for "/.s.PGSQL.NNNNN.lock" under the
	// 107-byte sun_path limit.
	maxSocketPath = 80
	confFile      = "converge.conf"
)

// pickPort is a variable so tests can simulate a port race.
var pickPort = freePort

// settingName matches GUC names; anything else could inject config lines.
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// Start initialises (unless Dir already holds a cluster) and starts a
// server, returning once it accepts connections. On failure nothing is left
// running and a temporary directory is removed.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	for k := range cfg.Settings {
		if !settingName.MatchString(k) {
			return nil, fmt.Errorf("pgcluster: invalid setting name %q", k)
		}
		if strings.EqualFold(k, "port") {
			return nil, errors.New(`pgcluster: set the port with Config.Port, not Settings["port"]`)
		}
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("pgcluster: invalid port %d", cfg.Port)
	}
	binDir, err := FindBinDir(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	as, err := serverIdentity()
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{binDir: binDir, as: as, log: logger, noWatchdog: cfg.NoWatchdog}

	var createdRoot bool
	if cfg.Dir == "" {
		root, err := os.MkdirTemp("", "converge-pg-")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: create temp dir: %w", err)
		}
		c.root, c.temp, createdRoot = root, true, true
	} else {
		root, err := filepath.Abs(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
			createdRoot = true
		}
		if err := os.MkdirAll(root, 0o700); err != nil {
			return nil, fmt.Errorf("pgcluster: create dir: %w", err)
		}
		c.root = root
	}
	defer func() {
		if err != nil {
			c.cleanupFailedStart()
		}
	}()
	if createdRoot {
		if err := c.as.chown(c.root); err != nil {
			return nil, err
		}
	}

	c.dataDir = filepath.Join(c.root, "data")
	c.logFile = filepath.Join(c.root, "postgres.log")
	c.sockDir = filepath.Join(c.root, "run")
	if len(c.sockDir) > maxSocketPath {
		// A Unix socket path that is too long makes the server fail to start.
		d, err := os.MkdirTemp("", "cpg-")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: create socket dir: %w", err)
		}
		c.sockDir, c.sockTemp = d, true
	}
	// Guard the temporary directories already, so dying during initdb or
	// the first start does not leave them behind.
	if err := c.syncWatchdog(); err != nil {
		return nil, err
	}
	if err := c.prepareDirs(); err != nil {
		return nil, err
	}

	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err != nil {
		if err := c.initdb(ctx); err != nil {
			return nil, err
		}
	} else {
		c.log.Info("pgcluster: reusing existing data directory", "data_dir", c.dataDir)
	}
	if err := c.includeConf(); err != nil {
		return nil, err
	}

	settings := c.settings(cfg.Settings)
	for attempt := 1; ; attempt++ {
		c.port = cfg.Port
		if c.port == 0 {
			if c.port, err = pickPort(); err != nil {
				return nil, err
			}
		}
		if err = c.writeConf(settings); err != nil {
			return nil, err
		}
		err = c.startServer(ctx)
		if err == nil {
			break
		}
		if cfg.Port != 0 || attempt >= maxPortAttempts || !isBindError(err) || ctx.Err() != nil {
			return nil, err
		}
		c.log.Warn("pgcluster: port taken, retrying with another", "port", c.port, "attempt", attempt)
	}
	c.running = true
	if err := c.syncWatchdog(); err != nil {
		return nil, err
	}
	return c, nil
}

// URL returns a connection URL for database as the superuser "postgres".
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(database))
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the data directory (PGDATA).
func (c *Cluster) DataDir() string { return c.dataDir }

// Stop shuts the server down (fast mode: sessions are disconnected, data is
// checkpointed), removes the cluster directory if Start created it as a
// temporary one and ends the watchdog. Calling it again is a no-op.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.syncWatchdogLogged()
	if c.removed {
		return nil
	}
	if c.running {
		if err := c.stopServer(ctx, "fast"); err != nil {
			return err
		}
		c.running = false
	}
	if c.sockTemp {
		_ = os.RemoveAll(c.sockDir)
	}
	if c.temp {
		if err := os.RemoveAll(c.root); err != nil {
			return fmt.Errorf("pgcluster: remove %s: %w", c.root, err)
		}
		c.removed = true
	}
	return nil
}

// StopKeep shuts the server down in fast mode and keeps all files, so
// Restart can bring it back. The watchdog then only guards a temporary
// directory, if any, until Stop.
func (c *Cluster) StopKeep(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.syncWatchdogLogged()
	if c.removed {
		return ErrRemoved
	}
	if !c.running {
		return nil
	}
	if err := c.stopServer(ctx, "fast"); err != nil {
		return err
	}
	c.running = false
	return nil
}

// Kill simulates a crash: an immediate shutdown without a checkpoint, so the
// next start runs crash recovery. Files are kept.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.syncWatchdogLogged()
	if c.removed {
		return ErrRemoved
	}
	if !c.running {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := c.stopServer(ctx, "immediate"); err != nil {
		return err
	}
	c.running = false
	return nil
}

// Restart starts the server again on the same port and data directory. A
// running server is stopped (fast) first.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.syncWatchdogLogged()
	if c.removed {
		return ErrRemoved
	}
	if c.running {
		if err := c.stopServer(ctx, "fast"); err != nil {
			return err
		}
		c.running = false
	}
	if err := c.prepareDirs(); err != nil {
		return err
	}
	if err := c.startServer(ctx); err != nil {
		return err
	}
	c.running = true
	return nil
}

// prepareDirs creates the directories and log file owned by the server's
// OS user; initdb and postgres cannot create them inside a root-owned tree.
func (c *Cluster) prepareDirs() error {
	for _, d := range []string{c.dataDir, c.sockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("pgcluster: create %s: %w", d, err)
		}
	}
	f, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgcluster: create log file: %w", err)
	}
	_ = f.Close()
	return c.as.chown(c.dataDir, c.sockDir, c.logFile)
}

func (c *Cluster) initdb(ctx context.Context) error {
	start := time.Now()
	out, err := c.run(ctx, "initdb", "-D", c.dataDir, "--auth=trust", "--no-sync",
		"-U", "postgres", "-E", "UTF8", "--locale=C")
	if err != nil {
		return &StartError{Op: "initdb", Err: fmt.Errorf("%w: %s", err, lastLines(out, 20))}
	}
	c.log.Debug("pgcluster: initdb done", "data_dir", c.dataDir, "took", time.Since(start))
	return nil
}

// includeConf makes postgresql.conf include converge.conf last, once.
func (c *Cluster) includeConf() error {
	path := filepath.Join(c.dataDir, "postgresql.conf")
	content, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgcluster: read postgresql.conf: %w", err)
	}
	line := "include_if_exists = '" + confFile + "'"
	if bytes.Contains(content, []byte(line)) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: open postgresql.conf: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# Settings managed by converge (pgcluster).\n%s\n", line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: append to postgresql.conf: %w", err)
	}
	return nil
}

func (c *Cluster) settings(user map[string]string) map[string]string {
	s := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": c.sockDir,
		"wal_level":               "logical",
		"max_wal_senders":         "10",
		"max_replication_slots":   "10",
		// Throwaway clusters trade durability against OS crashes for speed;
		// a process crash (Kill) still loses nothing committed.
		"fsync":            "off",
		"full_page_writes": "off",
		"max_wal_size":     "4GB",
		"max_connections":  "200",
		"shared_buffers":   "128MB",
	}
	maps.Copy(s, user)
	return s
}

// writeConf rewrites converge.conf, in sorted key order so the file is
// deterministic; the port goes last so it cannot be overridden.
func (c *Cluster) writeConf(settings map[string]string) error {
	var b strings.Builder
	b.WriteString("# Managed by converge (pgcluster); rewritten on every start.\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = %s\n", k, quoteConf(settings[k]))
	}
	fmt.Fprintf(&b, "port = %d\n", c.port)
	path := filepath.Join(c.dataDir, confFile)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgcluster: write %s: %w", confFile, err)
	}
	return c.as.chown(path)
}

// quoteConf quotes a value for postgresql.conf, whose string literals
// accept ” and backslash escapes.
func quoteConf(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `''`, "\n", `\n`, "\r", `\r`)
	return "'" + r.Replace(v) + "'"
}

func (c *Cluster) startServer(ctx context.Context) error {
	offset := fileSize(c.logFile)
	start := time.Now()
	out, err := c.run(ctx, "pg_ctl", "start", "-D", c.dataDir, "-l", c.logFile,
		"-w", "-t", pgCtlWaitSeconds, "-s")
	if err != nil {
		// pg_ctl may have been killed by ctx while the postmaster lives on.
		c.forceStop()
		return &StartError{Op: "start", Port: c.port,
			Err:     fmt.Errorf("pg_ctl start: %w: %s", err, lastLines(out, 10)),
			LogTail: c.logTail(offset)}
	}
	if err := c.waitReady(ctx); err != nil {
		c.forceStop()
		return &StartError{Op: "ready", Port: c.port, Err: err, LogTail: c.logTail(offset)}
	}
	c.log.Info("pgcluster: server started", "port", c.port, "data_dir", c.dataDir, "took", time.Since(start))
	return nil
}

// waitReady confirms the server accepts real connections over TCP; pg_ctl
// -w only says the postmaster reported ready.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(c.URL("postgres"))
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 5 * time.Second
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server not accepting connections: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopServer stops the server with pg_ctl, falling back to SIGQUIT so a
// broken pg_ctl cannot leave a postmaster behind.
func (c *Cluster) stopServer(ctx context.Context, mode string) error {
	pid := c.pid()
	if !processAlive(pid) {
		return nil
	}
	out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", mode, "-w", "-t", pgCtlWaitSeconds, "-s")
	if err == nil || !processAlive(pid) {
		c.log.Info("pgcluster: server stopped", "mode", mode, "port", c.port)
		return nil
	}
	c.log.Warn("pgcluster: pg_ctl stop failed, sending SIGQUIT", "pid", pid, "err", err)
	_ = quitProcess(pid)
	if waitExit(pid, 10*time.Second) {
		return nil
	}
	return fmt.Errorf("pgcluster: stop server (pid %d): pg_ctl stop -m %s: %w: %s", pid, mode, err, lastLines(out, 10))
}

// forceStop makes sure no server is left after a failed start.
func (c *Cluster) forceStop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := c.stopServer(ctx, "immediate"); err != nil {
		c.log.Error("pgcluster: could not stop server after failed start", "err", err)
	}
}

func (c *Cluster) cleanupFailedStart() {
	if c.dataDir != "" {
		c.forceStop()
	}
	if c.sockTemp {
		_ = os.RemoveAll(c.sockDir)
	}
	if c.temp {
		_ = os.RemoveAll(c.root)
	}
	c.wd.end()
	c.wd = nil
}

// syncWatchdog makes the watchdog guard exactly what the cluster owns now:
// the running postmaster and the temporary directories that still exist.
// With nothing left to guard it is ended. A new watchdog is started before
// the old one is ended so there is no unguarded gap. c.mu must be held
// unless the cluster is not shared yet.
func (c *Cluster) syncWatchdog() error {
	if c.noWatchdog {
		return nil
	}
	pm := 0
	if c.running {
		pm = c.pid()
	}
	var dirs []string
	if c.temp && !c.removed {
		dirs = append(dirs, c.root)
	}
	if c.sockTemp {
		if _, err := os.Stat(c.sockDir); err == nil {
			dirs = append(dirs, c.sockDir)
		}
	}
	if c.wd != nil && c.wd.pm == pm && slices.Equal(c.wd.dirs, dirs) {
		return nil
	}
	var next *watchdog
	if pm > 0 || len(dirs) > 0 {
		var err error
		if next, err = startWatchdog(pm, c.dataDir, dirs); err != nil {
			return err // keep the old watchdog: it still guards the directories
		}
		c.log.Debug("pgcluster: watchdog armed", "watchdog_pid", next.pid(), "postmaster_pid", pm, "dirs", dirs)
	}
	c.wd.end()
	c.wd = next
	return nil
}

// syncWatchdogLogged is syncWatchdog for state changes that have already
// succeeded or failed on their own merits; a watchdog failure is reported
// rather than turned into the operation's error.
func (c *Cluster) syncWatchdogLogged() {
	if err := c.syncWatchdog(); err != nil {
		c.log.Error("pgcluster: watchdog not updated; the server may outlive this process", "err", err)
	}
}

// pid returns the postmaster PID from postmaster.pid, or 0.
func (c *Cluster) pid() int {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	return pid
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.root
	cmd.Env = serverEnv()
	// pg_ctl's postmaster writes to the log file, not our pipe, but guard
	// against a child holding the pipe open anyway.
	cmd.WaitDelay = 5 * time.Second
	c.as.apply(cmd)
	c.log.Debug("pgcluster: exec", "cmd", name, "args", args)
	return cmd.CombinedOutput()
}

// serverEnv drops PG* variables (PGPORT, PGDATA, PGOPTIONS, ...) that would
// otherwise leak the caller's Postgres setup into the throwaway cluster, and
// forces English messages so log checks work.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

func (c *Cluster) logTail(offset int64) string {
	f, err := os.Open(c.logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	const maxTail = 8 << 10
	if size := fileSize(c.logFile); size-offset > maxTail {
		offset = size - maxTail
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return lastLines(b, 20)
}

func isBindError(err error) bool {
	var se *StartError
	if !errors.As(err, &se) {
		return false
	}
	for _, s := range []string{"could not bind", "Address already in use", "could not create any TCP/IP sockets"} {
		if strings.Contains(se.LogTail, s) {
			return true
		}
	}
	return false
}

// freePort is a port the cluster keeps across restarts (see
// localaddr.Free: no outgoing connection is given it while it is down).
func freePort() (int, error) {
	port, err := localaddr.FreePort()
	if err != nil {
		return 0, fmt.Errorf("pgcluster: pick a free port: %w", err)
	}
	return port, nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func waitExit(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}
