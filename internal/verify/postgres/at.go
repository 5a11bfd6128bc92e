package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/verify"
)

var _ verify.PositionedTruth = (*Postgres)(nil)

// bucketOf is the bucket of d.key among $1, as verify.Bucket computes it:
// the one expression of every query here that reads buckets.
const bucketOf = `(('x' || substr(encode(sha256(convert_to(d.key, 'UTF8')), 'hex'), 1, 8))::bit(32)::bigint % $1)::int`

// DigestsAt implements verify.PositionedTruth: the digests of buckets
// alone, and the WAL position they were read at. Postgres still hashes
// every key to find the buckets' documents (a sequential scan of
// documents), and builds the lines of those documents alone.
func (p *Postgres) DigestsAt(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int]verify.BucketDigest, verify.Position, error) {
	out := make(map[int]verify.BucketDigest, len(buckets))
	for _, b := range buckets {
		out[b] = verify.BucketDigest{}
	}
	pos, err := p.readAt(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
SELECT bucket, count(*)::int, sha256(string_agg(sha256(convert_to(line, 'UTF8')), ''::bytea ORDER BY key COLLATE "C"))
FROM (`+docLines+` WHERE `+bucketOf+` = ANY($3)) x GROUP BY bucket`, n, kind == verify.Graph, buckets)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b, docs int
			var sum []byte
			if err := rows.Scan(&b, &docs, &sum); err != nil {
				return err
			}
			if _, ok := out[b]; !ok || len(sum) != 32 {
				return fmt.Errorf("bucket %d not asked for, or a digest of %d bytes", b, len(sum))
			}
			d := verify.BucketDigest{Docs: docs}
			copy(d.Digest[:], sum)
			out[b] = d
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, fmt.Errorf("postgres digests: %w", err)
	}
	return out, pos, nil
}

// BucketsAt implements verify.PositionedTruth: the documents of buckets,
// and the WAL position they were read at.
func (p *Postgres) BucketsAt(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, verify.Position, error) {
	var out map[int][]verify.Doc
	pos, err := p.readAt(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = readBuckets(ctx, tx, kind, n, buckets)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return out, pos, nil
}

// readAt runs read in a read-only transaction of one snapshot, then reads
// the WAL's insert position: every transaction the snapshot sees wrote its
// commit record before that position, so that once the relay has
// confirmed it, every event of what read saw is in the stream.
func (p *Postgres) readAt(ctx context.Context, read func(pgx.Tx) error) (verify.Position, error) {
	var lsn verify.Position
	err := pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := read(tx); err != nil {
			return err
		}
		var text string
		if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&text); err != nil {
			return fmt.Errorf("read the WAL position: %w", err)
		}
		var err error
		lsn, err = verify.ParseLSN(text)
		return err
	})
	return lsn, err
}
