package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// converge source apply installs the configuration file's mappings and
// hands the rows over; again, it has nothing to do; sql prints what it
// runs; status counts what is pending; config check reads the section.
func TestSourceCommands(t *testing.T) {
	ctx := context.Background()
	url := pg.MigratedDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE posts (id int PRIMARY KEY, title text, body text);
		INSERT INTO posts VALUES (1, 'One', 'first'), (2, 'Two', 'second')`); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "converge.yaml")
	if err := os.WriteFile(file, []byte(`
cli:
  postgres-url: `+url+`
sources:
  posts:
    table: posts
    title: title
    body: body
`), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := dispatch(ctx, args, &out); err != nil {
			t.Fatalf("converge %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	if got := run("source", "apply", "-config", file); !strings.Contains(got, "source posts: public.posts mapped by view public.converge_source_posts: installed; 2 rows handed over") {
		t.Fatalf("first apply: %q", got)
	}
	if got := run("source", "apply", "-config", file); !strings.Contains(got, ": unchanged\n") {
		t.Fatalf("second apply: %q", got)
	}
	if got := run("source", "sql", "-config", file); !strings.Contains(got, `CREATE TRIGGER "converge_source_posts_insert" AFTER INSERT ON "public"."posts"`) ||
		!strings.Contains(got, `'posts/' || ("posts"."id")::text`) {
		t.Fatalf("sql: %q", got)
	}
	if got := run("source", "status", "-postgres-url", url); !strings.Contains(got, "posts") || !strings.Contains(got, "2 pending") {
		t.Fatalf("status: %q", got)
	}
	if got := run("config", "check", file); !strings.Contains(got, "; 1 sources") {
		t.Fatalf("config check: %q", got)
	}
	// A mapping with an unknown setting, and one naming no table.
	for _, c := range []struct{ yaml, want string }{
		{"sources:\n  posts:\n    table: posts\n    titel: title\n", `:4: sources.posts: unknown setting "titel"`},
		{"sources:\n  posts:\n    body: body\n", ":2: source posts: table is required"},
		{"sources:\n  Posts:\n    table: posts\n", "the name must be a lower-case letter"},
	} {
		if err := os.WriteFile(file, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := dispatch(ctx, []string{"config", "check", file}, &out); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config check of %q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

// verify notes rows handed over and not applied yet (or refused): the
// stores were compared without them.
func TestHandedOverNote(t *testing.T) {
	ctx := context.Background()
	url := pg.MigratedDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if note := handedOverNote(ctx, pool); note != "" {
		t.Fatalf("an empty inbox: %q", note)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO converge_inbox (source, row_id) VALUES ('posts', '1'), ('posts', '2');
		INSERT INTO converge_inbox (key, document, refused_at, refused_code, refused_message) VALUES ('c', '{}', now(), 'missing_version', 'version is missing')`); err != nil {
		t.Fatal(err)
	}
	if note := handedOverNote(ctx, pool); !strings.Contains(note, "2 handed-over rows not applied yet and 1 refused") {
		t.Fatalf("note %q", note)
	}
}
