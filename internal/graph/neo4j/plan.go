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

// lockStatements lock every node the batch's transaction will write or
// whose relationships it will write, documents by key and then tags by
// name: every transaction takes its locks in this one order, and all of
// them before any other write, so that concurrent transactions wait for
// each other instead of deadlocking. The nodes are those of the batch's
// documents, and, of each document that readBatch (held) shows the guard
// will apply, its old and new link targets and tags: a document the
// guard skips creates nothing, not even the stubs of its links. The
// guard's own answer, under the lock, still decides what is written; the
// prediction can only be wrong for a document written concurrently by
// something else than this backend (calls for one document are never
// concurrent), and then costs no more than a deadlock retried.
func lockStatements(batch []docRow, held map[string]heldDoc) []statement {
	var keys, tags []string
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
	out := []statement{{"lockDocuments", cypherLockDocuments, map[string]any{"keys": sortedDistinct(keys)}}}
	if tags = sortedDistinct(tags); len(tags) > 0 {
		out = append(out, statement{"lockTags", cypherLockTags, map[string]any{"names": tags}})
	}
	return out
}

// guardStatement is the statement after the locks of a batch's
// transaction.
func guardStatement(batch []docRow) statement {
	rows := make([]map[string]any, len(batch))
	for i, r := range batch {
		rows[i] = map[string]any{
			"key":          r.doc.Key,
			"version":      r.doc.Version,
			"deleted":      r.doc.Deleted,
			"title":        r.doc.Title,
			"content_hash": r.doc.ContentHash,
			"repair":       r.doc.Repair,
		}
	}
	return statement{"mergeDocuments", cypherMergeDocuments, map[string]any{"rows": rows}}
}

// guardResult reads the guard's answer: applied[i] for batch[i].
func guardResult(batch []docRow, recs []record) ([]bool, error) {
	byKey := make(map[string]bool, len(recs))
	for _, rec := range recs {
		key, ok1 := rec["key"].(string)
		applied, ok2 := rec["applied"].(bool)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("mergeDocuments answered %v, want a key and an applied flag", rec)
		}
		if _, dup := byKey[key]; dup {
			return nil, fmt.Errorf("mergeDocuments answered twice for %q", key)
		}
		byKey[key] = applied
	}
	out := make([]bool, len(batch))
	for i, r := range batch {
		applied, ok := byKey[r.doc.Key]
		if !ok {
			return nil, fmt.Errorf("mergeDocuments did not answer for %q", r.doc.Key)
		}
		out[i] = applied
	}
	if len(byKey) != len(batch) {
		return nil, fmt.Errorf("mergeDocuments answered for %d keys, want %d", len(byKey), len(batch))
	}
	return out, nil
}

// writeStatements replace the chunks and outgoing relationships of the
// applied documents (sorted by key): node writes first, then relationship
// writes. A statement that would have no rows is left out.
func writeStatements(applied []docRow) []statement {
	if len(applied) == 0 {
		return nil
	}
	keys := make([]string, len(applied))
	var chunks, hasChunk, links, tagged []map[string]any
	var targets, tags []string
	for i, r := range applied {
		d := r.doc
		keys[i] = d.Key
		for _, c := range d.Chunks {
			id := c.ID.String()
			chunks = append(chunks, map[string]any{
				"id": id, "key": d.Key, "version": d.Version, "ordinal": int64(c.Ordinal), "content_hash": c.ContentHash,
			})
			hasChunk = append(hasChunk, map[string]any{"key": d.Key, "id": id})
		}
		for _, t := range d.Links {
			links = append(links, map[string]any{"key": d.Key, "target": t})
		}
		for _, t := range d.Tags {
			tagged = append(tagged, map[string]any{"key": d.Key, "tag": t})
		}
		targets = append(targets, d.Links...)
		tags = append(tags, d.Tags...)
	}
	targets, tags = sortedDistinct(targets), sortedDistinct(tags)

	out := []statement{{"deleteChunks", cypherDeleteChunks, map[string]any{"keys": keys}}}
	if len(chunks) > 0 {
		out = append(out, statement{"mergeChunks", cypherMergeChunks, map[string]any{"chunks": chunks}})
	}
	if len(targets) > 0 {
		out = append(out, statement{"mergeLinkTargets", cypherMergeLinkTargets, map[string]any{"keys": targets}})
	}
	if len(tags) > 0 {
		out = append(out, statement{"mergeTags", cypherMergeTags, map[string]any{"names": tags}})
	}
	out = append(out, statement{"deleteEdges", cypherDeleteEdges, map[string]any{"keys": keys}})
	if len(hasChunk) > 0 {
		out = append(out, statement{"mergeHasChunk", cypherMergeHasChunk, map[string]any{"rows": hasChunk}})
	}
	if len(links) > 0 {
		out = append(out, statement{"mergeLinks", cypherMergeLinks, map[string]any{"rows": links}})
	}
	if len(tagged) > 0 {
		out = append(out, statement{"mergeTagged", cypherMergeTagged, map[string]any{"rows": tagged}})
	}
	return out
}

// fenceStatement counts the relationships of the applied documents.
func fenceStatement(applied []docRow) statement {
	keys := make([]string, len(applied))
	for i, r := range applied {
		keys[i] = r.doc.Key
	}
	return statement{"countEdges", cypherCountEdges, map[string]any{"keys": keys}}
}

// checkFence compares the fence's counts with the applied documents'
// own, and names the first document (by key) that differs.
func checkFence(applied []docRow, recs []record) error {
	have := make(map[string]Counts, len(recs))
	for _, rec := range recs {
		key, ok := rec["key"].(string)
		chunks, ok1 := rec["chunks"].(int64)
		links, ok2 := rec["links"].(int64)
		tags, ok3 := rec["tags"].(int64)
		if !ok || !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("countEdges answered %v, want a key and three counts", rec)
		}
		have[key] = Counts{Chunks: int(chunks), Links: int(links), Tags: int(tags)}
	}
	for _, r := range applied {
		want := r.counts()
		got, ok := have[r.doc.Key]
		if !ok {
			return &FenceError{Key: r.doc.Key, Missing: true, Want: want}
		}
		if got != want {
			return &FenceError{Key: r.doc.Key, Have: got, Want: want}
		}
	}
	return nil
}

// appliedRows are the rows of batch whose flag is set.
func appliedRows(batch []docRow, applied []bool) []docRow {
	var out []docRow
	for i, r := range batch {
		if applied[i] {
			out = append(out, r)
		}
	}
	return out
}
