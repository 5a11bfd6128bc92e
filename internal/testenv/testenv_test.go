package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var pg *Postgres

func TestMain(m *testing.M) { os.Exit(RunMain(m, &pg)) }

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func tableExists(t *testing.T, conn *pgx.Conn, table string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	conn := connect(t, pg.Cluster.URL("postgres"))
	var ok bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func dbName(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func TestPostgresIsLogical(t *testing.T) {
	t.Parallel()
	var level string
	if err := connect(t, pg.NewDatabase(t)).QueryRow(t.Context(), "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("wal_level = %q, want logical", level)
	}
}

func TestNewDatabaseIsolation(t *testing.T) {
	t.Parallel()
	urlA, urlB := pg.NewDatabase(t), pg.NewDatabase(t)
	if urlA == urlB {
		t.Fatalf("two NewDatabase calls returned the same URL %s", urlA)
	}
	a, b := connect(t, urlA), connect(t, urlB)
	if _, err := a.Exec(t.Context(), "CREATE TABLE only_in_a (id int)"); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, a, "only_in_a") {
		t.Fatal("table missing in the database that created it")
	}
	if tableExists(t, b, "only_in_a") {
		t.Fatal("table created in database A is visible in database B")
	}
}

func TestNewDatabaseDroppedAtCleanup(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		url := pg.NewDatabase(t)
		name = dbName(t, url)
		// A connection still open at cleanup must not block the drop.
		conn, err := pgx.Connect(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		if !databaseExists(t, name) {
			t.Fatalf("database %s does not exist during the test", name)
		}
	})
	if name == "" || databaseExists(t, name) {
		t.Fatalf("database %q still exists after the subtest's cleanup", name)
	}
}

func TestNewDatabaseFromTemplate(t *testing.T) {
	var prepared atomic.Int32
	prepare := func(ctx context.Context, url string) error {
		prepared.Add(1)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL);
			INSERT INTO widgets VALUES (1, 'seed')`)
		return err
	}

	const n = 6
	urls := make(chan string, n)
	t.Run("group", func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				url := pg.NewDatabaseFrom(t, "widgets", prepare)
				urls <- url
				conn := connect(t, url)
				rows, _ := conn.Query(t.Context(), "SELECT name FROM widgets ORDER BY id") // error surfaces in CollectRows
				names, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(names, ",") != "seed" {
					t.Fatalf("template contents = %v, want [seed]", names)
				}
				// Writes stay in this clone.
				if _, err := conn.Exec(t.Context(), "INSERT INTO widgets VALUES ($1, 'mine')", 100+i); err != nil {
					t.Fatal(err)
				}
				var count int
				if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM widgets").Scan(&count); err != nil {
					t.Fatal(err)
				}
				if count != 2 {
					t.Fatalf("clone sees %d rows, want 2 (seed + own insert)", count)
				}
			})
		}
	})
	close(urls)

	if got := prepared.Load(); got != 1 {
		t.Fatalf("prepare ran %d times, want exactly 1", got)
	}
	seen := map[string]bool{}
	for u := range urls {
		if seen[u] {
			t.Fatalf("duplicate database URL %s", u)
		}
		seen[u] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d databases, want %d", len(seen), n)
	}

	// The template itself is untouched by the clones and refuses connections.
	_, err := pgx.Connect(t.Context(), pg.Cluster.URL("tmpl_widgets"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("connect to template: err = %v, want object_not_in_prerequisite_state (55000)", err)
	}
}

func TestNewDatabaseFromPrepareErrorIsReported(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	prepare := func(context.Context, string) error { calls.Add(1); return boom }

	for range 2 {
		ft := &fatalRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			pg.NewDatabaseFrom(ft, "broken", prepare)
		}()
		<-done
		if !strings.Contains(ft.msg, "boom") {
			t.Fatalf("fatal message = %q, want it to contain the prepare error", ft.msg)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("failing prepare ran %d times, want 1 (result is cached)", calls.Load())
	}
}

// fatalRecorder captures Fatalf so a helper's failure can be asserted.
type fatalRecorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit() // like t.FailNow: stop the helper's goroutine
}

func TestNewDatabaseFromRejectsBadName(t *testing.T) {
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pg.NewDatabaseFrom(ft, "Bad-Name", func(context.Context, string) error { return nil })
	}()
	<-done
	if !strings.Contains(ft.msg, "Bad-Name") {
		t.Fatalf("fatal message = %q, want a complaint about the name", ft.msg)
	}
}

func TestNATSJetStream(t *testing.T) {
	t.Parallel()
	n := StartNATS(t)
	if !strings.HasPrefix(n.URL, "nats://127.0.0.1:") {
		t.Fatalf("URL = %q, want nats://127.0.0.1:<port>", n.URL)
	}
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	ack, err := js.Publish(ctx, "events.a", []byte("hello"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ack.Stream != "EVENTS" || ack.Sequence != 1 {
		t.Fatalf("ack = %+v, want stream EVENTS seq 1", ack)
	}
	stream, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("get msg: %v", err)
	}
	if string(msg.Data) != "hello" || msg.Subject != "events.a" {
		t.Fatalf("got %s %q, want events.a %q", msg.Subject, msg.Data, "hello")
	}
}

func TestNATSRestartKeepsMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n1, err := StartNATSAt(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n1.Shutdown)
	port := n1.Port

	nc1, err := nats.Connect(n1.URL)
	if err != nil {
		t.Fatal(err)
	}
	js1, err := jetstream.New(nc1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: "DURABLE", Subjects: []string{"durable.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js1.Publish(ctx, "durable.x", []byte("survives")); err != nil {
		t.Fatal(err)
	}
	nc1.Close()
	n1.Shutdown()
	n1.Shutdown() // idempotent

	n2, err := StartNATSAt(dir, port)
	if err != nil {
		t.Fatalf("restart on port %d: %v", port, err)
	}
	t.Cleanup(n2.Shutdown)
	if n2.Port != port || n2.URL != n1.URL {
		t.Fatalf("restarted at %s (port %d), want %s (port %d)", n2.URL, n2.Port, n1.URL, port)
	}
	js2, err := jetstream.New(n2.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := js2.Stream(ctx2, "DURABLE")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx2, "durable.x")
	if err != nil {
		t.Fatalf("message after restart: %v", err)
	}
	if string(msg.Data) != "survives" || msg.Sequence != 1 {
		t.Fatalf("after restart got seq %d %q, want seq 1 %q", msg.Sequence, msg.Data, "survives")
	}
}
