// Package postgres is verify's truth: the documents and chunks Postgres
// holds, with their bucket digests computed in SQL. It only reads.
package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/verify"
)

// Postgres is the truth: the documents table and the chunks of each
// document's current version.
type Postgres struct {
	Pool *pgxpool.Pool
}

var _ verify.Side = (*Postgres)(nil)

// Name implements verify.Side.
func (p *Postgres) Name() string { return "postgres" }

// docLines is, per document, its key, bucket and canonical line (see
// verify.Doc.Line), built in SQL. $1 is the number of buckets, $2 true for the
// graph's line.
const docLines = `
SELECT d.key,
       ` + bucketOf + ` AS bucket,
       d.key || E'\x1f' || d.version::text || E'\x1f' || CASE WHEN d.deleted THEN '1' ELSE '0' END || E'\x1f' || d.content_hash || E'\x1f' ||
       coalesce((SELECT string_agg(c.id::text || ':' || ` + chunkHash + `, ',' ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '') ||
       CASE WHEN $2 THEN
           E'\x1f' || CASE WHEN d.deleted THEN '' ELSE coalesce((SELECT string_agg(l, E'\x1e' ORDER BY l COLLATE "C") FROM unnest(d.links) l), '') END ||
           E'\x1f' || CASE WHEN d.deleted THEN '' ELSE ` + tagsLine + ` END ||
           E'\x1f' || CASE WHEN d.deleted THEN '' ELSE d.title END
       ELSE '' END AS line
FROM documents d`

// tagsLine is d's tags sorted and joined by RS.
const tagsLine = `coalesce((SELECT string_agg(t, E'\x1e' ORDER BY t COLLATE "C") FROM unnest(d.tags) t), '')`

// chunkHash is the hash of chunk c of document d in a line: its text hash
// for the graph ($2), verify.IndexChunkHash of its text, d's title and
// d's tags for the index.
const chunkHash = `CASE WHEN $2 THEN c.content_hash ELSE encode(sha256(convert_to(c.text || E'\x1f' || d.title || E'\x1f' || ` + tagsLine + `, 'UTF8')), 'hex') END`

// Digests implements verify.Side: computed in the database, n rows cross the wire.
func (p *Postgres) Digests(ctx context.Context, kind verify.Kind, n int) ([]verify.BucketDigest, error) {
	rows, err := p.Pool.Query(ctx, `
SELECT bucket, count(*)::int, sha256(string_agg(sha256(convert_to(line, 'UTF8')), ''::bytea ORDER BY key COLLATE "C"))
FROM (`+docLines+`) x GROUP BY bucket`, n, kind == verify.Graph)
	if err != nil {
		return nil, fmt.Errorf("postgres digests: %w", err)
	}
	defer rows.Close()
	out := make([]verify.BucketDigest, n)
	for rows.Next() {
		var b, docs int
		var sum []byte
		if err := rows.Scan(&b, &docs, &sum); err != nil {
			return nil, err
		}
		if b < 0 || b >= n || len(sum) != 32 {
			return nil, fmt.Errorf("postgres digests: bucket %d of %d, digest of %d bytes", b, n, len(sum))
		}
		out[b].Docs = docs
		copy(out[b].Digest[:], sum)
	}
	return out, rows.Err()
}

// Buckets implements verify.Side.
func (p *Postgres) Buckets(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, error) {
	return readBuckets(ctx, p.Pool, kind, n, buckets)
}

func readBuckets(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, error) {
	rows, err := db.Query(ctx, `
SELECT bucket, key, version, deleted, content_hash, links, tags, title, ids, hashes FROM (
  SELECT `+bucketOf+` AS bucket,
         d.key, d.version, d.deleted, d.content_hash,
         CASE WHEN d.deleted THEN '{}' ELSE d.links END AS links, CASE WHEN d.deleted THEN '{}' ELSE d.tags END AS tags,
         CASE WHEN d.deleted THEN '' ELSE d.title END AS title,
         coalesce((SELECT array_agg(c.id ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '{}') AS ids,
         coalesce((SELECT array_agg(`+strings.ReplaceAll(chunkHash, "$2", "$3")+` ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '{}') AS hashes
  FROM documents d) x
WHERE bucket = ANY($2)
ORDER BY key COLLATE "C"`, n, buckets, kind == verify.Graph)
	if err != nil {
		return nil, fmt.Errorf("postgres buckets: %w", err)
	}
	defer rows.Close()
	out := make(map[int][]verify.Doc, len(buckets))
	for rows.Next() {
		var b int
		var d verify.Doc
		var ids [][16]byte
		var hashes []string
		if err := rows.Scan(&b, &d.Key, &d.Version, &d.Deleted, &d.ContentHash, &d.Links, &d.Tags, &d.Title, &ids, &hashes); err != nil {
			return nil, err
		}
		for i := range ids {
			d.Chunks = append(d.Chunks, verify.Chunk{ID: uuid.UUID(ids[i]), Hash: hashes[i]})
		}
		if kind != verify.Graph {
			d.Links, d.Tags, d.Title = nil, nil, ""
		}
		out[b] = append(out[b], d)
	}
	return out, rows.Err()
}
