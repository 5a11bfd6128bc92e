// Package verifytest holds verify sides for tests: a store in memory that
// a test changes while verify reads it (a projector applying a repair, say).
package verifytest

import (
	"context"
	"sync"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/verify"
)

// Side is a verify side in memory, safe to change while it is read.
type Side struct {
	label string
	mu    sync.Mutex
	docs  map[string]verify.Doc
}

// NewSide is a side called label holding docs (by key; copied).
func NewSide(label string, docs map[string]verify.Doc) *Side {
	s := &Side{label: label, docs: make(map[string]verify.Doc, len(docs))}
	for k, d := range docs {
		s.docs[k] = d
	}
	return s
}

// Put stores d under its key, as a projector applying it would.
func (s *Side) Put(docs ...verify.Doc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range docs {
		s.docs[d.Key] = d
	}
}

// Memory is a snapshot of the side.
func (s *Side) Memory() *verify.Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &verify.Memory{Label: s.label}
	for _, d := range s.docs {
		m.Docs = append(m.Docs, d)
	}
	return m
}

// Name is the side's label.
func (s *Side) Name() string { return s.label }

// Digests are those of the side's current documents.
func (s *Side) Digests(ctx context.Context, kind verify.Kind, n int) ([]verify.BucketDigest, error) {
	return s.Memory().Digests(ctx, kind, n)
}

// Buckets are those of the side's current documents.
func (s *Side) Buckets(ctx context.Context, kind verify.Kind, n int, buckets []int) (map[int][]verify.Doc, error) {
	return s.Memory().Buckets(ctx, kind, n, buckets)
}

// Doc is a document as verify reads it: key at version with content hash
// hash, chunks chunks of that hash (ids derived from the key), and links.
func Doc(key string, version int64, hash string, chunks int, links ...string) verify.Doc {
	d := verify.Doc{Key: key, Version: version, ContentHash: hash, Links: links}
	for i := range chunks {
		d.Chunks = append(d.Chunks, verify.Chunk{ID: uuid.NewSHA1(uuid.NameSpaceURL, []byte(key+string(rune('0'+i)))), Hash: hash})
	}
	return d
}
