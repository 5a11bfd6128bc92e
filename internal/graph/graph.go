// Package graph is the graph projection: every document, its chunks, its
// links to other documents and its tags, in a [Backend] (Neo4j, or the
// embedded graph), converged to the stream's events by the projector
// runtime.
//
// The model:
//
//	(:Document {key, version, title, content_hash, deleted})
//	(:Chunk {id, key, version, ordinal, content_hash})
//	(:Tag {name})
//	(:Document)-[:HAS_CHUNK]->(:Chunk)
//	(:Document)-[:LINKS_TO]->(:Document)
//	(:Document)-[:TAGGED]->(:Tag)
//
// Document.key, Chunk.id and Tag.name are unique (constraints in Neo4j).
// A link to a document not yet seen creates a stub node holding only its
// key, which that document's first upsert fills in.
//
// Writes are merges with a freshness guard held by the store itself: a
// version V of document K changes K's node, chunks and outgoing edges only
// when the stored version is older than V (or K is new or a stub); then K's
// chunks and outgoing LINKS_TO and TAGGED edges become exactly those of V,
// so no chunk or edge of an older version remains. A withdrawal keeps K's
// node as a tombstone (deleted, with its version), which a late older
// upsert cannot get past, and removes its chunks and outgoing edges; links
// from other documents to K stay. A count fence after each write checks
// that every written document has exactly its chunks, links and tags.
//
// A repair (a re-emitted event, applied in a call whose context is marked
// by projector.WithRepair) of the version the graph holds writes it again
// ([Doc.Repair]): K's node, chunks and outgoing edges are set to exactly
// those of V, which restores what was lost or altered behind the
// projector's back.
package graph

import (
	"context"
	"fmt"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// FromEvent is the graph's view of an event.
func FromEvent(ev *contract.Event) Doc {
	d := Doc{Key: ev.Key, Version: ev.Version, ContentHash: ev.ContentHash, Deleted: ev.Kind == contract.KindWithdrawn}
	if d.Deleted {
		return d
	}
	d.Title = ev.Title
	d.Links = append([]string(nil), ev.Links...)
	d.Tags = append([]string(nil), ev.Tags...)
	d.Chunks = make([]Chunk, len(ev.Chunks))
	for i, c := range ev.Chunks {
		d.Chunks[i] = Chunk{ID: c.ID, Ordinal: c.Ordinal, ContentHash: c.Hash}
	}
	return d
}

// Projection applies events to a Backend: the graph projector's store.
type Projection struct {
	backend Backend
}

// New returns a projection over backend, ensuring its constraints.
func New(ctx context.Context, backend Backend) (*Projection, error) {
	if err := backend.Ensure(ctx); err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	return &Projection{backend: backend}, nil
}

// Backend is the store under the projection.
func (p *Projection) Backend() Backend { return p.backend }

// Apply implements projector.Store. If the batch fails permanently, the
// events are applied one by one so that only the one the store rejects
// fails. In a repair call (projector.IsRepair), every Doc is a Repair.
func (p *Projection) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	results := make([]projector.Result, len(events))
	docs := make([]Doc, len(events))
	repair := projector.IsRepair(ctx)
	for i, ev := range events {
		docs[i] = FromEvent(ev)
		docs[i].Repair = repair
	}
	applied, err := p.backend.Apply(ctx, docs)
	if err == nil && len(applied) != len(docs) {
		err = fmt.Errorf("graph: store answered %d results for %d documents", len(applied), len(docs))
	}
	if err == nil {
		for i, ok := range applied {
			if !ok {
				results[i].Outcome = projector.Skipped
			}
		}
		return results
	}
	if !projector.IsPermanent(err) || len(docs) == 1 {
		for i := range results {
			results[i].Err = err
		}
		return results
	}
	for i := range docs {
		one, err := p.backend.Apply(ctx, docs[i:i+1])
		switch {
		case err != nil:
			results[i].Err = err
		case len(one) == 1 && !one[0]:
			results[i].Outcome = projector.Skipped
		}
	}
	return results
}
