// Package verify proves that a projection agrees with Postgres, document
// by document, without comparing every document when they agree.
//
// Every document has a state: key, version, withdrawn, content hash, and
// its chunks in ordinal order, each an id and a hash of what a reader
// gets of it (in the index, [IndexChunkHash] of the point's text, title
// and tags, from the point itself; in the graph, the text hash its chunk
// node holds); the graph's state also has the document's links, tags and
// title. Its digest is the SHA-256 of a
// canonical line (see [Doc.Line]). Documents are spread over buckets by a
// hash of their key; a bucket's digest is the SHA-256 of the digests of its
// documents in key (byte) order. Postgres computes its bucket digests in
// SQL, a projection in the process that owns it (see [Digests]); verify
// compares the bucket digests and asks both sides for the documents of the
// buckets that differ only, and reports each difference per document.
// What crosses the wire, and what is compared, grows with the number of
// differences, not with the corpus; each side still reads its own store
// once to compute its digests.
//
// [Watcher] verifies continuously: a few buckets at a time at a set pace,
// each store compared once its projection has passed the WAL position
// Postgres was read at ([Progress], read by [Pipeline] from the relay's
// slot, the stream and the projectors' consumers), a difference named when
// two comparisons in a row find it, and, with a [Reemitter], repaired.
// It only reads, but for the re-emissions, which the writer records.
package verify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/embed"
)

// Kind selects what a digest covers.
type Kind string

const (
	// Index covers key, version, withdrawn, content hash and chunks
	// (their text, title and tags).
	Index Kind = "index"
	// Graph covers the same, chunks by their text hash, and the
	// document's links, tags and title.
	Graph Kind = "graph"
)

// DefaultBuckets is the number of buckets verify uses.
const DefaultBuckets = 1024

// Chunk is a chunk in a document's state.
type Chunk struct {
	ID   uuid.UUID `json:"id"`
	Hash string    `json:"hash"`
}

// Doc is a document's state as one side holds it.
type Doc struct {
	Key         string   `json:"key"`
	Version     int64    `json:"version"`
	Deleted     bool     `json:"deleted"`
	ContentHash string   `json:"content_hash"`
	Chunks      []Chunk  `json:"chunks"`
	Links       []string `json:"links,omitempty"` // graph only
	Tags        []string `json:"tags,omitempty"`  // graph only
	Title       string   `json:"title,omitempty"` // graph only; empty when withdrawn
}

// IndexChunkHash is what verify compares of an index point: the lowercase
// hex SHA-256 of its text, the document's title and its tags (sorted,
// joined by RS), separated by US, all of them what a search returns.
// Postgres computes the same from its chunks and documents rows.
func IndexChunkHash(text, title string, tags []string) string {
	sum := sha256.Sum256([]byte(text + fieldSep + title + fieldSep + strings.Join(sorted(tags), itemSep)))
	return hex.EncodeToString(sum[:])
}

// The separators of a canonical line: control characters, which keys,
// links and tags never contain.
const (
	fieldSep = "\x1f"
	itemSep  = "\x1e"
)

// Line is the canonical text whose SHA-256 is the document's digest:
//
//	key US version US withdrawn(0|1) US content_hash US id:hash,id:hash...
//
// and for the graph, then US links joined by RS US tags joined by RS (both
// sorted) US title, where US is U+001F and RS U+001E. Postgres builds the
// same line in SQL.
func (d Doc) Line(kind Kind) string {
	var b strings.Builder
	b.WriteString(d.Key)
	b.WriteString(fieldSep)
	b.WriteString(strconv.FormatInt(d.Version, 10))
	b.WriteString(fieldSep)
	if d.Deleted {
		b.WriteString("1")
	} else {
		b.WriteString("0")
	}
	b.WriteString(fieldSep)
	b.WriteString(d.ContentHash)
	b.WriteString(fieldSep)
	for i, c := range d.Chunks {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(c.ID.String())
		b.WriteString(":")
		b.WriteString(c.Hash)
	}
	if kind == Graph {
		b.WriteString(fieldSep)
		b.WriteString(strings.Join(sorted(d.Links), itemSep))
		b.WriteString(fieldSep)
		b.WriteString(strings.Join(sorted(d.Tags), itemSep))
		b.WriteString(fieldSep)
		b.WriteString(d.Title)
	}
	return b.String()
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// Digest is the document's digest.
func (d Doc) Digest(kind Kind) [32]byte { return sha256.Sum256([]byte(d.Line(kind))) }

// Bucket is the bucket of key among n: the first four bytes of the key's
// SHA-256 as a big-endian number, modulo n.
func Bucket(key string, n int) int {
	sum := sha256.Sum256([]byte(key))
	return int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
}

// BucketDigest is a bucket's digest and its number of documents.
type BucketDigest struct {
	Docs   int `json:"docs"`
	Digest Sum `json:"digest"`
}

// Sum is a SHA-256 digest, hex in JSON.
type Sum [32]byte

// MarshalText implements encoding.TextMarshaler.
func (s Sum) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(s[:])), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Sum) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != len(s) {
		return fmt.Errorf("verify: digest of %d hex digits, want %d", len(b), 2*len(s))
	}
	_, err := hex.Decode(s[:], b)
	return err
}

// Memory is a side whose documents were read into memory: a projection's
// store read once by the process that owns it.
type Memory struct {
	Label string
	Docs  []Doc
}

// Name implements Side.
func (m *Memory) Name() string { return m.Label }

// Digests implements Side.
func (m *Memory) Digests(_ context.Context, kind Kind, n int) ([]BucketDigest, error) {
	return Digests(kind, n, m.Docs), nil
}

// Buckets implements Side.
func (m *Memory) Buckets(_ context.Context, kind Kind, n int, buckets []int) (map[int][]Doc, error) {
	want := make(map[int]bool, len(buckets))
	for _, b := range buckets {
		want[b] = true
	}
	out := make(map[int][]Doc, len(buckets))
	for _, d := range m.Docs {
		if b := Bucket(d.Key, n); want[b] {
			if kind != Graph {
				d.Links, d.Tags, d.Title = nil, nil, ""
			}
			out[b] = append(out[b], d)
		}
	}
	return out, nil
}

// Digests computes the bucket digests of docs (in any order).
func Digests(kind Kind, n int, docs []Doc) []BucketDigest {
	byBucket := make([][]Doc, n)
	for _, d := range docs {
		b := Bucket(d.Key, n)
		byBucket[b] = append(byBucket[b], d)
	}
	out := make([]BucketDigest, n)
	for i, ds := range byBucket {
		out[i] = bucketDigest(kind, ds)
	}
	return out
}

func bucketDigest(kind Kind, docs []Doc) BucketDigest {
	if len(docs) == 0 {
		return BucketDigest{}
	}
	slices.SortFunc(docs, func(a, b Doc) int { return strings.Compare(a.Key, b.Key) })
	h := sha256.New()
	for _, d := range docs {
		sum := d.Digest(kind)
		h.Write(sum[:])
	}
	var out BucketDigest
	out.Docs = len(docs)
	copy(out.Digest[:], h.Sum(nil))
	return out
}

// Side is one side of a comparison: Postgres, or a projection.
type Side interface {
	// Name names the side in reports ("postgres", "index", "graph").
	Name() string
	// Digests returns the digest of each of n buckets.
	Digests(ctx context.Context, kind Kind, n int) ([]BucketDigest, error)
	// Buckets returns the documents of the given buckets of n, by bucket.
	Buckets(ctx context.Context, kind Kind, n int, buckets []int) (map[int][]Doc, error)
}

// Problem kinds of a [Difference].
const (
	Missing         = "missing"          // Postgres has the document, the projection does not
	Extra           = "extra"            // the projection has a document Postgres does not
	StaleVersion    = "stale_version"    // the projection holds an older version
	VersionMismatch = "version_mismatch" // the projection holds a version Postgres never committed last
	ContentMismatch = "content_mismatch" // same version, other content hash or withdrawn flag
	StaleChunks     = "stale_chunks"     // same version and hash, other chunks (left over, or missing)
	LinksMismatch   = "links_mismatch"   // graph: other links or tags
	// DigestMismatch: bucket digests differ while the documents of those
	// buckets, read after them, compare equal. Either the two sides compute
	// digests differently, or the store changed between the two reads
	// (writes still arriving): a later verify tells which.
	DigestMismatch = "digest_mismatch"
)

// Difference is one document on which a projection disagrees with Postgres.
type Difference struct {
	Key      string `json:"key"`
	Problem  string `json:"problem"`
	Detail   string `json:"detail"`
	Expected *Doc   `json:"expected,omitempty"`
	Actual   *Doc   `json:"actual,omitempty"`
	// Partition is the document's partition, when the verify was asked
	// of a projector's partitions ([Partitions]).
	Partition *int `json:"partition,omitempty"`
}

// Report is the outcome of comparing one projection with Postgres.
type Report struct {
	Store            string       `json:"store"`
	Kind             Kind         `json:"kind"`
	Buckets          int          `json:"buckets"`
	Documents        int          `json:"documents"`         // in Postgres
	StoreDocuments   int          `json:"store_documents"`   // in the projection
	DifferingBuckets int          `json:"differing_buckets"` // buckets whose digests differ
	Differences      []Difference `json:"differences"`
	Agrees           bool         `json:"agrees"`
	// Embedder made the vectors of the index's live generation, as its
	// projector reports it; nil for the graph.
	Embedder *embed.Identity `json:"embedder,omitempty"`
	// Partitions is the number of partitions the differences are
	// labelled by, and Partition the one partition this report speaks
	// of (Agrees and Differences then are that partition's alone); see
	// [Partitions].
	Partitions int  `json:"partitions,omitempty"`
	Partition  *int `json:"partition,omitempty"`
}

// Compare compares store with the truth (Postgres), descending only into
// buckets whose digests differ. progress, if not nil, is called after each
// differing bucket is compared.
func Compare(ctx context.Context, truth, store Side, kind Kind, n int, progress func(done, total int)) (Report, error) {
	rep := Report{Store: store.Name(), Kind: kind, Buckets: n, Differences: []Difference{}}
	want, err := truth.Digests(ctx, kind, n)
	if err != nil {
		return rep, fmt.Errorf("verify: %s digests: %w", truth.Name(), err)
	}
	got, err := store.Digests(ctx, kind, n)
	if err != nil {
		return rep, fmt.Errorf("verify: %s digests: %w", store.Name(), err)
	}
	if e, ok := store.(interface{ Embedder() *embed.Identity }); ok {
		rep.Embedder = e.Embedder()
	}
	if len(want) != n || len(got) != n {
		return rep, fmt.Errorf("verify: %d and %d bucket digests, want %d", len(want), len(got), n)
	}
	var differing []int
	for b := range n {
		rep.Documents += want[b].Docs
		rep.StoreDocuments += got[b].Docs
		if want[b] != got[b] {
			differing = append(differing, b)
		}
	}
	rep.DifferingBuckets = len(differing)
	// Differing buckets are fetched from both sides a slice at a time.
	const step = 64
	for lo := 0; lo < len(differing); lo += step {
		part := differing[lo:min(lo+step, len(differing))]
		wantDocs, err := truth.Buckets(ctx, kind, n, part)
		if err != nil {
			return rep, fmt.Errorf("verify: %s buckets: %w", truth.Name(), err)
		}
		gotDocs, err := store.Buckets(ctx, kind, n, part)
		if err != nil {
			return rep, fmt.Errorf("verify: %s buckets: %w", store.Name(), err)
		}
		for _, b := range part {
			rep.Differences = append(rep.Differences, diffBucket(kind, wantDocs[b], gotDocs[b])...)
		}
		if progress != nil {
			progress(lo+len(part), len(differing))
		}
	}
	slices.SortFunc(rep.Differences, func(a, b Difference) int { return strings.Compare(a.Key, b.Key) })
	rep.Agrees = len(differing) == 0
	if !rep.Agrees && len(rep.Differences) == 0 {
		// Digests differ but no document does: the sides computed them
		// differently. Never call that agreement.
		rep.Differences = append(rep.Differences, Difference{Problem: DigestMismatch,
			Detail: fmt.Sprintf("%d buckets differ in digest while their documents compare equal", len(differing))})
	}
	return rep, nil
}

func diffBucket(kind Kind, want, got []Doc) []Difference {
	byKey := make(map[string]Doc, len(got))
	for _, d := range got {
		byKey[d.Key] = d
	}
	var out []Difference
	for _, w := range want {
		g, ok := byKey[w.Key]
		delete(byKey, w.Key)
		w := w
		if !ok {
			out = append(out, Difference{Key: w.Key, Problem: Missing, Expected: &w,
				Detail: fmt.Sprintf("Postgres holds version %d; the store has no such document", w.Version)})
			continue
		}
		if d, ok := diffDoc(kind, w, g); ok {
			out = append(out, d)
		}
	}
	for _, g := range byKey {
		g := g
		out = append(out, Difference{Key: g.Key, Problem: Extra, Actual: &g,
			Detail: fmt.Sprintf("the store holds version %d; Postgres has no such document", g.Version)})
	}
	return out
}

func diffDoc(kind Kind, w, g Doc) (Difference, bool) {
	d := Difference{Key: w.Key, Expected: &w, Actual: &g}
	switch {
	case g.Version < w.Version:
		d.Problem, d.Detail = StaleVersion, fmt.Sprintf("the store holds version %d, Postgres %d", g.Version, w.Version)
	case g.Version > w.Version:
		d.Problem, d.Detail = VersionMismatch, fmt.Sprintf("the store holds version %d, newer than Postgres's %d", g.Version, w.Version)
	case g.Deleted != w.Deleted || g.ContentHash != w.ContentHash:
		d.Problem, d.Detail = ContentMismatch, fmt.Sprintf("version %d: the store has withdrawn=%v hash %s, Postgres withdrawn=%v hash %s",
			w.Version, g.Deleted, g.ContentHash, w.Deleted, w.ContentHash)
	case !slices.Equal(g.Chunks, w.Chunks):
		d.Problem, d.Detail = StaleChunks, fmt.Sprintf("version %d: the store has %d chunks, Postgres %d, or other ones", w.Version, len(g.Chunks), len(w.Chunks))
	case kind == Graph && (!slices.Equal(sorted(g.Links), sorted(w.Links)) || !slices.Equal(sorted(g.Tags), sorted(w.Tags))):
		d.Problem, d.Detail = LinksMismatch, fmt.Sprintf("version %d: the store has links %v tags %v, Postgres links %v tags %v", w.Version, g.Links, g.Tags, w.Links, w.Tags)
	case kind == Graph && g.Title != w.Title:
		d.Problem, d.Detail = ContentMismatch, fmt.Sprintf("version %d: the store has title %q, Postgres %q", w.Version, g.Title, w.Title)
	case !bytes.Equal([]byte(w.Line(kind)), []byte(g.Line(kind))):
		d.Problem, d.Detail = ContentMismatch, "the documents' canonical lines differ"
	default:
		return d, false
	}
	return d, true
}
