package docstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Record is the stored current version of a document.
type Record struct {
	Key         string          `json:"key"`
	Version     int64           `json:"version"`
	Withdrawn   bool            `json:"withdrawn"`
	Title       string          `json:"title"`
	Body        string          `json:"body"`
	Links       []string        `json:"links"`
	Tags        []string        `json:"tags"`
	Meta        json.RawMessage `json:"meta"`
	ContentHash string          `json:"content_hash"`
	Chunks      int             `json:"chunks"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

const getSQL = `
SELECT d.key, d.version, d.deleted, d.title, d.links, d.tags, d.meta::text, d.content_hash, d.chunk_count, d.updated_at,
       coalesce((SELECT string_agg(c.text, '' ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '')
FROM documents d WHERE d.key = $1`

// Get returns the current record of key, tombstone or not, or [ErrNotFound].
func (s *Store) Get(ctx context.Context, key string) (Record, error) {
	var (
		r    Record
		meta string
	)
	err := s.pool.QueryRow(ctx, getSQL, key).Scan(&r.Key, &r.Version, &r.Withdrawn, &r.Title, &r.Links, &r.Tags,
		&meta, &r.ContentHash, &r.Chunks, &r.UpdatedAt, &r.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("docstore: get: %w", err)
	}
	r.Meta = json.RawMessage(meta)
	return r, nil
}
