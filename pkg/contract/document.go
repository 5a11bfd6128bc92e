package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Limits of a document. The writer enforces them and answers 413 or 422 with
// the matching code above them; every component downstream may rely on them.
const (
	MaxKeyBytes   = 512
	MaxTitleBytes = 4 << 10
	// MaxBodyBytes bounds the body. An event carries the body in its chunks,
	// so this also bounds an event's size (see MaxEventBytes).
	MaxBodyBytes = 4 << 20
	MaxMetaBytes = 64 << 10
	MaxLinks     = 1024
	MaxTags      = 256
	MaxTagBytes  = 256
	// MaxMessageBytes is the NATS max_payload converge needs (8 MB): an
	// event travels as one message.
	MaxMessageBytes = 8 << 20
	// MaxEventBytes bounds an encoded event, leaving room for headers in
	// one message. The writer refuses (413 event_too_large) a document whose
	// event would be larger, which only a body full of characters that JSON
	// escapes can reach.
	MaxEventBytes = MaxMessageBytes - 64<<10
)

// Document is what a producer writes: the unit of identity and versioning.
type Document struct {
	Key     string          `json:"key"`
	Version int64           `json:"version"`
	Title   string          `json:"title"`
	Body    string          `json:"body"`
	Links   []string        `json:"links"`
	Tags    []string        `json:"tags"`
	Meta    json.RawMessage `json:"meta"`
}

// ValidateKey checks a document key: 1 to MaxKeyBytes bytes of UTF-8 without
// control characters.
func ValidateKey(key string) error { return validateKey("key", CodeMissingKey, key) }

func validateKey(field, emptyCode, key string) error {
	switch {
	case key == "":
		return invalid(emptyCode, field, "must not be empty")
	case len(key) > MaxKeyBytes:
		return invalid(CodeKeyTooLong, field, "is %d bytes, more than the limit of %d", len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return invalid(CodeInvalidUTF8, field, "is not valid UTF-8")
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return invalid(CodeKeyControlChar, field, "has control character %U at byte %d", r, i)
		}
	}
	return nil
}

// ValidateVersion checks a version: an int64 greater than zero.
func ValidateVersion(v int64) error {
	if v <= 0 {
		return invalid(CodeInvalidVersion, "version", "must be greater than 0, got %d", v)
	}
	return nil
}

func validateText(field string, s string, limit int, limitCode string) error {
	if len(s) > limit {
		return invalid(limitCode, field, "is %d bytes, more than the limit of %d", len(s), limit)
	}
	if !utf8.ValidString(s) {
		return invalid(CodeInvalidUTF8, field, "is not valid UTF-8")
	}
	// Postgres text cannot hold NUL; refuse it here rather than fail later.
	if i := strings.IndexByte(s, 0); i >= 0 {
		return invalid(CodeNULCharacter, field, "has a NUL character at byte %d", i)
	}
	return nil
}

// Normalize validates d and returns its canonical form: links and tags
// sorted and deduplicated (they are sets), meta re-encoded canonically (keys
// sorted, no insignificant space), nil slices made empty. Two documents with
// the same canonical form have the same [ContentHash].
func (d Document) Normalize() (Document, error) {
	if err := ValidateKey(d.Key); err != nil {
		return Document{}, err
	}
	if err := ValidateVersion(d.Version); err != nil {
		return Document{}, err
	}
	if err := validateText("title", d.Title, MaxTitleBytes, CodeTitleTooLong); err != nil {
		return Document{}, err
	}
	if err := validateText("body", d.Body, MaxBodyBytes, CodeBodyTooLarge); err != nil {
		return Document{}, err
	}
	if len(d.Links) > MaxLinks {
		return Document{}, invalid(CodeTooManyLinks, "links", "has %d links, more than the limit of %d", len(d.Links), MaxLinks)
	}
	for _, l := range d.Links {
		if err := validateKey("links", CodeInvalidLink, l); err != nil {
			var ve *ValidationError
			_ = asValidation(err, &ve)
			return Document{}, invalid(CodeInvalidLink, "links", "link %q: %s", truncate(l, 64), ve.Message)
		}
	}
	if len(d.Tags) > MaxTags {
		return Document{}, invalid(CodeTooManyTags, "tags", "has %d tags, more than the limit of %d", len(d.Tags), MaxTags)
	}
	for _, t := range d.Tags {
		if t == "" || len(t) > MaxTagBytes || !utf8.ValidString(t) || strings.ContainsFunc(t, unicode.IsControl) {
			return Document{}, invalid(CodeInvalidTag, "tags", "tag %q must be 1 to %d bytes of UTF-8 without control characters", truncate(t, 64), MaxTagBytes)
		}
	}
	meta, err := CanonicalMeta(d.Meta)
	if err != nil {
		return Document{}, err
	}
	return Document{
		Key:     d.Key,
		Version: d.Version,
		Title:   d.Title,
		Body:    d.Body,
		Links:   sortedSet(d.Links),
		Tags:    sortedSet(d.Tags),
		Meta:    meta,
	}, nil
}

func asValidation(err error, target **ValidationError) bool {
	ve, ok := err.(*ValidationError) //nolint:errorlint // validateKey returns it unwrapped
	if ok {
		*target = ve
	}
	return ok
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

func sortedSet(in []string) []string {
	out := slices.Clone(in)
	if out == nil {
		return []string{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// CanonicalMeta validates that raw is a JSON object (or empty, meaning {})
// and returns it canonically encoded: object keys sorted, numbers as
// written, no insignificant white space, no HTML escaping.
func CanonicalMeta(raw json.RawMessage) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	if len(trimmed) > MaxMetaBytes {
		return nil, invalid(CodeMetaTooLarge, "meta", "is %d bytes, more than the limit of %d", len(trimmed), MaxMetaBytes)
	}
	if !utf8.Valid(trimmed) {
		return nil, invalid(CodeInvalidUTF8, "meta", "is not valid UTF-8")
	}
	out, ok := canonicalMetaFast(trimmed)
	if !ok {
		var err error
		if out, err = canonicalMetaDecoded(trimmed); err != nil {
			return nil, err
		}
	}
	if err := checkMetaNumbers(out); err != nil {
		return nil, err
	}
	return out, nil
}

// canonicalMetaDecoded is the definition of the canonical meta: decode into
// an any, numbers kept as written, and encode that with encoding/json, which
// sorts map keys. It also words every refusal.
func canonicalMetaDecoded(trimmed []byte) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, invalid(CodeInvalidMeta, "meta", "is not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, invalid(CodeInvalidMeta, "meta", "has data after the JSON object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, invalid(CodeInvalidMeta, "meta", "must be a JSON object")
	}
	if hasNUL(v) {
		return nil, invalid(CodeNULCharacter, "meta", "has a NUL character in a string")
	}
	return canonicalJSON(v)
}

func hasNUL(v any) bool {
	switch t := v.(type) {
	case string:
		return strings.IndexByte(t, 0) >= 0
	case []any:
		return slices.ContainsFunc(t, hasNUL)
	case map[string]any:
		for k, e := range t {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// canonicalJSON encodes v deterministically: encoding/json sorts map keys.
func canonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, invalid(CodeInvalidMeta, "meta", "cannot be encoded: %v", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ContentHash is the lowercase hex SHA-256 of the canonical JSON of a
// normalised document's content, in this order: key, title, body, links,
// tags, meta. Version is not part of it: the same content at two versions
// has the same hash. Call it on the result of [Document.Normalize].
func ContentHash(d Document) string {
	st := contentHashers.Get().(*contentHasher)
	defer contentHashers.Put(st)
	st.h.Reset()
	// Meta that is not valid JSON (Normalize lets none through) writes
	// nothing: the hash of nothing, as when encoding/json failed.
	st.meta, st.stage, _ = writeCanonicalDocument(st.h, st.meta, st.stage, d)
	if cap(st.meta) > 4*stageSize {
		st.meta = nil // do not keep a large meta's buffer in the pool
	}
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], st.h.Sum(st.sum[:0]))
	return string(out[:])
}

// contentHasher is the reusable state of ContentHash.
type contentHasher struct {
	h     hash.Hash
	sum   [sha256.Size]byte // Sum's destination: a local would escape
	meta  []byte
	stage []byte
}

var contentHashers = sync.Pool{New: func() any {
	return &contentHasher{h: sha256.New(), stage: make([]byte, 0, stageSize)}
}}

// WithdrawnHash is the content hash of a withdrawn (tombstoned) document.
func WithdrawnHash(key string) string {
	sum := sha256.Sum256([]byte("converge.withdrawn:" + key))
	return hex.EncodeToString(sum[:])
}

// TextHash is the lowercase hex SHA-256 of a chunk's text.
func TextHash(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:])
}
