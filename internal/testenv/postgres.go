package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/pgcluster"
)

const (
	startTimeout = 2 * time.Minute
	// opTimeout bounds CREATE/DROP DATABASE, which wait for other sessions
	// to leave the template for up to 5 s.
	opTimeout = time.Minute
	// prepareTimeout bounds a template's prepare function (e.g. migrations).
	prepareTimeout = 5 * time.Minute
)

// Postgres is a PostgreSQL cluster shared by the tests of one package.
type Postgres struct {
	Cluster *pgcluster.Cluster

	admin   *pgxpool.Pool // connection to the "postgres" database for DDL
	counter atomic.Uint64

	mu        sync.Mutex
	templates map[string]*template
}

// template is prepared once; done is closed when err is final.
type template struct {
	done chan struct{}
	err  error
}

// StartPostgres starts a cluster with extra settings (may be nil). It is
// meant for TestMain; most packages should use RunMain instead.
func StartPostgres(settings map[string]string) (*Postgres, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: settings})
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(c.URL("postgres"))
	if err == nil {
		cfg.MaxConns = 8
		var admin *pgxpool.Pool
		if admin, err = pgxpool.NewWithConfig(ctx, cfg); err == nil {
			return &Postgres{Cluster: c, admin: admin, templates: map[string]*template{}}, nil
		}
	}
	_ = c.Stop(context.Background())
	return nil, fmt.Errorf("testenv: connect to test cluster: %w", err)
}

// HasLZ4 reports whether the cluster's server was built with lz4, which
// migration 5 compresses the outbox's payloads with when it is.
func (p *Postgres) HasLZ4(t testing.TB) bool {
	t.Helper()
	var lz4 bool
	err := p.admin.QueryRow(context.Background(),
		`SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'`).Scan(&lz4)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return lz4
}

// Close stops the cluster and removes its files.
func (p *Postgres) Close() {
	if p == nil {
		return
	}
	p.admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := p.Cluster.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stop PostgreSQL: %v\n", err)
	}
}

// RunMain is the body of a package's TestMain: it starts Postgres into *pg,
// runs the tests and stops Postgres before returning the exit code, so that
// cleanup is not skipped by os.Exit (deferred calls in TestMain would be).
// If Postgres cannot start, the tests fail loudly instead of being skipped,
// so a missing server can never make a CI run look green.
func RunMain(m *testing.M, pg **Postgres) int {
	p, err := StartPostgres(nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: cannot start PostgreSQL for tests: %v\n"+
			"(run scripts/ensure-postgres.sh to install the server binaries)\n", err)
		return 1
	}
	*pg = p
	defer func() {
		p.Close()
		*pg = nil
	}()
	return m.Run()
}

// NewDatabase creates an empty database with a unique name, drops it when
// the test ends, and returns its URL.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	return p.createDatabase(t, "")
}

// NewDatabaseFrom returns the URL of a new database cloned from the template
// "tmpl_<name>". The first call for a name creates the template and runs
// prepare(ctx, templateURL) on it; concurrent and later calls wait for that
// and then clone it, which is much faster than preparing each database. If
// prepare fails, every test using that name fails with its error.
// prepare must close its connections before returning: a template cannot be
// cloned while sessions are connected to it.
func (p *Postgres) NewDatabaseFrom(t testing.TB, name string, prepare func(ctx context.Context, url string) error) string {
	t.Helper()
	if !validName.MatchString(name) {
		t.Fatalf("testenv: template name %q must match %s", name, validName)
	}
	tmplName := "tmpl_" + name

	p.mu.Lock()
	tmpl, exists := p.templates[name]
	if !exists {
		tmpl = &template{done: make(chan struct{})}
		p.templates[name] = tmpl
	}
	p.mu.Unlock()

	if !exists {
		func() {
			// Waiters must be released even if prepare panics.
			defer close(tmpl.done)
			tmpl.err = errors.New("prepare did not return (panicked or called t.FailNow)")
			tmpl.err = p.createTemplate(tmplName, prepare)
		}()
	}
	<-tmpl.done
	if tmpl.err != nil {
		t.Fatalf("testenv: template %s: %v", tmplName, tmpl.err)
	}
	return p.createDatabase(t, tmplName)
}

// validName keeps template names usable as identifiers without quoting
// surprises and within the 63-byte limit.
var validName = regexp.MustCompile(`^[a-z0-9_]{1,50}$`)

func (p *Postgres) createTemplate(tmplName string, prepare func(ctx context.Context, url string) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
	defer cancel()
	ident := pgx.Identifier{tmplName}.Sanitize()
	if _, err := p.admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := prepare(ctx, p.Cluster.URL(tmplName)); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	// Refuse new connections and drop leftover ones, so cloning never fails
	// with "source database is being accessed by other users".
	if _, err := p.admin.Exec(ctx, "ALTER DATABASE "+ident+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("mark as template: %w", err)
	}
	if _, err := p.admin.Exec(ctx,
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
		tmplName); err != nil {
		return fmt.Errorf("disconnect sessions: %w", err)
	}
	return nil
}

func (p *Postgres) createDatabase(t testing.TB, tmplName string) string {
	t.Helper()
	name := fmt.Sprintf("t_%s_%d", sanitize(t.Name()), p.counter.Add(1))
	ident := pgx.Identifier{name}.Sanitize()
	sql := "CREATE DATABASE " + ident
	if tmplName != "" {
		sql += " TEMPLATE " + pgx.Identifier{tmplName}.Sanitize()
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := p.admin.Exec(ctx, sql); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
	t.Cleanup(func() {
		// The test's own t.Cleanup-closed connections may still be open if
		// registered earlier; FORCE disconnects them.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		// A test that restarts the cluster leaves the pool's idle
		// connections dead; the pool discards one that failed, so the
		// next attempt gets a fresh one.
		var err error
		for range 3 {
			if _, err = p.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err == nil {
				return
			}
		}
		t.Errorf("testenv: drop database %s: %v", name, err)
	})
	return p.Cluster.URL(name)
}

var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// sanitize turns a test name into a short identifier fragment that helps
// find a test's database when debugging; uniqueness comes from a counter.
func sanitize(testName string) string {
	s := strings.Trim(nonIdent.ReplaceAllString(strings.ToLower(testName), "_"), "_")
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	return s
}
