package neo4j

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
)

// statement is one Cypher statement with its parameters.
type statement struct {
	name   string // names the statement in errors and golden files
	cypher string
	params map[string]any
}

// record is one record of a statement's result, by column.
type record = map[string]any

// docRow is a validated document of an Apply and its position in the
// input. Its Links and Tags are sorted and distinct; a withdrawal has no
// chunks, links or tags.
type docRow struct {
	doc   graph.Doc
	index int
}

func (r docRow) counts() Counts {
	return Counts{Chunks: len(r.doc.Chunks), Links: len(r.doc.Links), Tags: len(r.doc.Tags)}
}

// planBatches validates docs and splits them, sorted by key, into batches
// of at most size. The documents are copied, never modified.
func planBatches(docs []graph.Doc, size int) ([][]docRow, error) {
	rows := make([]docRow, len(docs))
	chunkIDs := make(map[uuid.UUID]string)
	for i, d := range docs {
		if d.Key == "" {
			return nil, fmt.Errorf("%w: document %d has an empty key", ErrInvalidDocs, i)
		}
		if d.Deleted {
			d.Chunks, d.Links, d.Tags = nil, nil, nil
		} else {
			d.Chunks = slices.Clone(d.Chunks)
			d.Links = sortedDistinct(d.Links)
			d.Tags = sortedDistinct(d.Tags)
		}
		for _, c := range d.Chunks {
			if c.ID == uuid.Nil {
				return nil, fmt.Errorf("%w: document %q: chunk %d has no id", ErrInvalidDocs, d.Key, c.Ordinal)
			}
			if other, dup := chunkIDs[c.ID]; dup {
				return nil, fmt.Errorf("%w: chunk id %s appears in %q and %q", ErrInvalidDocs, c.ID, other, d.Key)
			}
			chunkIDs[c.ID] = d.Key
		}
		if len(d.Links) > 0 && d.Links[0] == "" {
			return nil, fmt.Errorf("%w: document %q links to an empty key", ErrInvalidDocs, d.Key)
		}
		if len(d.Tags) > 0 && d.Tags[0] == "" {
			return nil, fmt.Errorf("%w: document %q has an empty tag", ErrInvalidDocs, d.Key)
		}
		rows[i] = docRow{doc: d, index: i}
	}
	slices.SortFunc(rows, func(a, b docRow) int { return cmp.Compare(a.doc.Key, b.doc.Key) })
	for i := 1; i < len(rows); i++ {
		if rows[i].doc.Key == rows[i-1].doc.Key {
			return nil, fmt.Errorf("%w: key %q appears twice", ErrInvalidDocs, rows[i].doc.Key)
		}
	}
	var batches [][]docRow
	for len(rows) > 0 {
		n := min(size, len(rows))
		batches = append(batches, rows[:n:n])
		rows = rows[n:]
	}
	return batches, nil
}

func sortedDistinct(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// readStatement is the first statement of a batch's transaction: what the
// graph holds of its documents, before any lock.
func readStatement(batch []docRow) statement {
	keys := make([]string, len(batch))
	for i, r := range batch {
		keys[i] = r.doc.Key
	}
	return statement{"readBatch", cypherReadBatch, map[string]any{"keys": keys}}
}

// heldDoc is what readBatch found of a document.
type heldDoc struct {
	versioned   bool // false: a stub
	version     int64
	links, tags []string
}

// readResult reads readBatch's answer, by key.
func readResult(recs []record) (map[string]heldDoc, error) {
	held := make(map[string]heldDoc, len(recs))
	for _, rec := range recs {
		var h heldDoc
		key, ok := rec["key"].(string)
		if !ok {
			return nil, fmt.Errorf("readBatch answered %v, want a key", rec)
		}
		if rec["version"] != nil {
			if h.version, ok = rec["version"].(int64); !ok {
				return nil, fmt.Errorf("readBatch answered version %T for %q, want an integer", rec["version"], key)
			}
			h.versioned = true
		}
		if err := decodeValue(rec["links"], &h.links); err != nil {
			return nil, fmt.Errorf("readBatch: links of %q: %w", key, err)
		}
		if err := decodeValue(rec["tags"], &h.tags); err != nil {
			return nil, fmt.Errorf("readBatch: tags of %q: %w", key, err)
		}
		held[key] = h
	}
	return held, nil
}

// lockSets are the nodes that a batch's transaction locks before any
// other write: every node it will write or whose relationships it will
// write, documents (keys) by key and then tags (names) by name: every
// transaction takes its locks in this one order, and all of
// them before any other write, so that concurrent transactions wait for
// each other instead of deadlocking. The nodes are those of the batch's
// documents, and, of each document that readBatch (held) shows the guard
// will apply, its old and new link targets and tags: a document the
// guard skips creates nothing, not even the stubs of its links. The
// guard's own answer, under the lock, still decides what is written; the
// prediction can only be wrong for a document written concurrently by
// something else than this backend (calls for one document are never
// concurrent), and then costs no more than a deadlock retried.
func lockSets(batch []docRow, held map[string]heldDoc) (keys, names []string) {
	var tags []string
	for _, r := range batch {
		keys = append(keys, r.doc.Key)
		h, ok := held[r.doc.Key]
		if ok && h.versioned && (h.version > r.doc.Version || h.version == r.doc.Version && !r.doc.Repair) {
			continue
		}
		keys = append(keys, r.doc.Links...)
		keys = append(keys, h.links...)
		tags = append(tags, r.doc.Tags...)
		tags = append(tags, h.tags...)
	}
	return sortedDistinct(keys), append([]string{}, sortedDistinct(tags)...)
}

// writeStatement is the statement after readBatch (held) of a batch's
// transaction: the locks, the guard, the writes of the documents it
// applies, and the count fence.
func writeStatement(batch []docRow, held map[string]heldDoc) statement {
	keys, names := lockSets(batch, held)
	rows := make([]map[string]any, len(batch))
	for i, r := range batch {
		d := r.doc
		chunks := make([]map[string]any, len(d.Chunks))
		for j, c := range d.Chunks {
			chunks[j] = map[string]any{"id": c.ID.String(), "ordinal": int64(c.Ordinal), "content_hash": c.ContentHash}
		}
		rows[i] = map[string]any{
			"key":          d.Key,
			"version":      d.Version,
			"deleted":      d.Deleted,
			"title":        d.Title,
			"content_hash": d.ContentHash,
			"repair":       d.Repair,
			"chunks":       chunks,
			"links":        append([]string{}, d.Links...),
			"tags":         append([]string{}, d.Tags...),
		}
	}
	return statement{"writeDocuments", cypherWriteDocuments, map[string]any{"keys": keys, "names": names, "rows": rows}}
}

// writeResult reads writeDocuments' answer: applied[i] for batch[i], once
// the count fence has passed for every applied document; a mismatch is a
// [*FenceError] naming the first document (by key) that differs.
func writeResult(batch []docRow, recs []record) ([]bool, error) {
	type answer struct {
		applied bool
		have    Counts
	}
	byKey := make(map[string]answer, len(recs))
	for _, rec := range recs {
		key, ok1 := rec["key"].(string)
		applied, ok2 := rec["applied"].(bool)
		chunks, ok3 := rec["chunks"].(int64)
		links, ok4 := rec["links"].(int64)
		tags, ok5 := rec["tags"].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return nil, fmt.Errorf("writeDocuments answered %v, want a key, an applied flag and three counts", rec)
		}
		if _, dup := byKey[key]; dup {
			return nil, fmt.Errorf("writeDocuments answered twice for %q", key)
		}
		byKey[key] = answer{applied, Counts{Chunks: int(chunks), Links: int(links), Tags: int(tags)}}
	}
	out := make([]bool, len(batch))
	for i, r := range batch {
		a, ok := byKey[r.doc.Key]
		if !ok {
			return nil, fmt.Errorf("writeDocuments did not answer for %q", r.doc.Key)
		}
		out[i] = a.applied
	}
	if len(byKey) != len(batch) {
		return nil, fmt.Errorf("writeDocuments answered for %d keys, want %d", len(byKey), len(batch))
	}
	for i, r := range batch {
		if !out[i] {
			continue
		}
		if want, have := r.counts(), byKey[r.doc.Key].have; have != want {
			return nil, &FenceError{Key: r.doc.Key, Have: have, Want: want}
		}
	}
	return out, nil
}
