package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/pkg/contract"
)

// shopSchema is a small schema of a team's own: articles with authors,
// and tags in a join table; its owner is shop_owner.
const shopSchema = `
CREATE TABLE shop.authors (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.tags (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.articles (
    id bigserial PRIMARY KEY,
    author_id int NOT NULL REFERENCES shop.authors,
    title text NOT NULL,
    body text NOT NULL,
    archived boolean NOT NULL DEFAULT false);
CREATE TABLE shop.article_tags (
    article_id bigint REFERENCES shop.articles ON DELETE CASCADE,
    tag_id int REFERENCES shop.tags,
    PRIMARY KEY (article_id, tag_id));
INSERT INTO shop.authors VALUES (1, 'Ada'), (2, 'Brian'), (3, 'Grace');
INSERT INTO shop.tags SELECT i, 'tag-' || i FROM generate_series(1, 5) i;
INSERT INTO shop.articles (author_id, title, body)
    SELECT 1 + i % 3, 'Article ' || i, 'The body of article ' || i || ', about subject ' || (i % 17) || '.'
    FROM generate_series(1, 100) i;
INSERT INTO shop.article_tags SELECT a.id, 1 + a.id % 5 FROM shop.articles a;
INSERT INTO shop.article_tags SELECT a.id, 1 + (a.id + 2) % 5 FROM shop.articles a WHERE a.id % 3 = 0;
`

// articlesMapping maps shop.articles: tags from the join table, a link to
// the author, the author's name in meta.
func articlesMapping() source.Mapping {
	return source.Mapping{
		Name: "articles", Table: "shop.articles",
		Key:   "'article/' || id",
		Title: "title", Body: "body",
		Tags:   "ARRAY(SELECT t.name FROM shop.article_tags at JOIN shop.tags t ON t.id = at.tag_id WHERE at.article_id = articles.id)",
		Links:  "ARRAY['author/' || author_id]",
		Meta:   "jsonb_build_object('author', (SELECT name FROM shop.authors a WHERE a.id = articles.author_id))",
		Follow: []source.Follow{{Table: "shop.article_tags", Row: "article_id"}},
	}
}

// A table a team already has, mapped to documents, through inserts,
// updates (of the table and of the join table it follows), deletes, a
// rollback, a bulk insert and a bulk update of 10,000 rows in one
// statement each, and a mapping change (a filter and a new key for some
// rows): after each, the writer has applied every handed-over row, the
// documents are exactly what the mapping gives for the table's rows, and
// verify agrees. The table's owner holds converge_producer and nothing
// else of converge's.
func TestAMappedTableIsFollowed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := startStack(t, ctx)
	admin, err := pgxpool.New(ctx, s.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const ownerPassword = "shop-owner-password-0123456789" //nolint:gosec // a throwaway cluster's
	mustExec(t, admin, `CREATE ROLE shop_owner LOGIN PASSWORD '`+ownerPassword+`'`)
	mustExec(t, admin, `GRANT `+roles.Producer+` TO shop_owner`)
	mustExec(t, admin, `CREATE SCHEMA shop AUTHORIZATION shop_owner`)
	ownerURL, err := roles.URL(s.PostgresURL, "shop_owner", ownerPassword)
	if err != nil {
		t.Fatal(err)
	}
	app, err := pgxpool.New(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	mustExec(t, app, shopSchema)

	// The owner hands over and nothing more of converge's.
	for _, sql := range []string{`SELECT 1 FROM documents`, `SELECT 1 FROM outbox`, `SELECT 1 FROM converge_mapped_rows`,
		`UPDATE converge_inbox SET refused_at = now()`, `DELETE FROM converge_inbox`} {
		var pgErr *pgconn.PgError
		if _, err := app.Exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("shop_owner: %s: %v, want permission denied", sql, err)
		}
	}

	apply := func(m source.Mapping) source.Result {
		t.Helper()
		conn, err := app.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		res, err := source.Apply(ctx, conn.Conn(), m, false)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	check := func(step string, wantDocs int) {
		t.Helper()
		start := time.Now()
		waitInboxDrained(t, ctx, admin, step)
		docs := mappedMatchesDocuments(t, admin, step)
		if docs != wantDocs {
			t.Fatalf("%s: %d documents, want %d", step, docs, wantDocs)
		}
		waitAgrees(t, ctx, s, admin, step)
		t.Logf("%s: %d documents agree, %v after the change", step, docs, time.Since(start).Round(time.Millisecond))
	}

	res := apply(articlesMapping())
	if !res.Created || res.HandedOver != 100 {
		t.Fatalf("first apply: %+v, want created with 100 rows handed over", res)
	}
	check("backfill", 100)
	if res := apply(articlesMapping()); res.Created || res.Changed || res.HandedOver != 0 {
		t.Fatalf("the same mapping again: %+v, want nothing to do", res)
	}

	tx := func(sqls ...string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			for _, sql := range sqls {
				if _, err := tx.Exec(ctx, sql); err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tx(`INSERT INTO shop.articles (author_id, title, body) SELECT 2, 'New ' || i, 'A new article, number ' || i FROM generate_series(1, 20) i`,
		`INSERT INTO shop.article_tags SELECT id, 4 FROM shop.articles WHERE title LIKE 'New %'`)
	check("inserts", 120)
	tx(`UPDATE shop.articles SET title = title || ' (revised)' WHERE id <= 10`,
		`DELETE FROM shop.article_tags WHERE article_id BETWEEN 11 AND 20`,
		`INSERT INTO shop.article_tags VALUES (21, 5) ON CONFLICT DO NOTHING`)
	check("updates", 120)
	tx(`DELETE FROM shop.articles WHERE id IN (3, 4, 5, 6, 7)`)
	check("deletes", 115)

	// A rollback hands nothing over.
	if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO shop.articles (author_id, title, body) VALUES (1, 'Never', 'rolled back')`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE shop.articles SET body = 'rolled back' WHERE id = 1`); err != nil {
			return err
		}
		return errors.New("roll back")
	}); err == nil {
		t.Fatal("the transaction committed")
	}
	var inbox int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM converge_inbox`).Scan(&inbox); err != nil || inbox != 0 {
		t.Fatalf("after a rollback: %d rows in the inbox (%v)", inbox, err)
	}
	check("rollback", 115)

	// TRUNCATE would skip the withdrawals: refused.
	if _, err := app.Exec(ctx, `TRUNCATE shop.articles CASCADE`); err == nil || !strings.Contains(err.Error(), "DELETE its rows instead") {
		t.Fatalf("TRUNCATE of a mapped table: %v", err)
	}

	tx(`INSERT INTO shop.articles (author_id, title, body)
		SELECT 1 + i % 3, 'Bulk ' || i, 'A bulk article, number ' || i || ', on subject ' || (i % 31) || '.' FROM generate_series(1, 9885) i`)
	check("bulk insert", 10000)
	tx(`UPDATE shop.articles SET body = body || ' Updated in bulk.'`)
	check("bulk update of 10,000 rows", 10000)

	// The mapping changes: archived rows leave, the first 50 get another
	// key. An author renamed meanwhile (a table the mapping reads but does
	// not follow) is in every document of hers after the re-emission.
	mustExec(t, app, `UPDATE shop.articles SET archived = true WHERE id % 100 = 0`) // 100 rows
	check("archived, not yet filtered", 10000)
	mustExec(t, app, `UPDATE shop.authors SET name = 'Ada L.' WHERE id = 1`)
	m := articlesMapping()
	m.Where = "NOT archived"
	m.Key = "CASE WHEN id <= 50 THEN 'featured/' ELSE 'article/' END || id"
	res = apply(m)
	if !res.Changed || res.HandedOver != 10000 {
		t.Fatalf("a changed mapping: %+v, want changed with 10000 rows handed over", res)
	}
	check("mapping change", 9900)
	var featured int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM documents WHERE key LIKE 'featured/%' AND NOT deleted`).Scan(&featured); err != nil || featured != 45 {
		t.Fatalf("%d featured documents (%v), want 45 (ids 1 to 50 but 3 to 7)", featured, err)
	}
}

// mappedMatchesDocuments checks that the live documents of the articles
// source are exactly what its view gives, content for content, and
// returns how many there are.
func mappedMatchesDocuments(t *testing.T, admin *pgxpool.Pool, step string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := admin.Query(ctx, `SELECT key, title, body, tags, links, meta::text FROM shop.converge_source_articles`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	var d contract.Document
	var meta string
	if _, err := pgx.ForEachRow(rows, []any{&d.Key, &d.Title, &d.Body, &d.Tags, &d.Links, &meta}, func() error {
		d.Version, d.Meta = 1, json.RawMessage(meta)
		n, err := d.Normalize()
		if err != nil {
			return err
		}
		want[d.Key] = contract.ContentHash(n)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows, err = admin.Query(ctx, `SELECT key, content_hash FROM documents WHERE NOT deleted`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var k, h string
	if _, err := pgx.ForEachRow(rows, []any{&k, &h}, func() error { got[k] = h; return nil }); err != nil {
		t.Fatal(err)
	}
	for k, h := range want {
		if got[k] != h {
			t.Fatalf("%s: document %s is %q, the table gives %q", step, k, got[k], h)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Fatalf("%s: document %s is live, the table gives none", step, k)
		}
	}
	return len(want)
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
