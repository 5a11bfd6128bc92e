package contract

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// SchemaV1 is the schema of every event this version of the contract writes.
// A decoder refuses any other schema rather than guess.
const SchemaV1 = "converge.event.v1"

// Kind is what happened to a document version.
type Kind string

// The kinds of event.
const (
	KindUpserted  Kind = "document.upserted"
	KindWithdrawn Kind = "document.withdrawn"
)

// Event is the versioned, self-sufficient record of one document version. The
// outbox row and the JetStream message carry the same canonical encoding.
// Projectors need nothing else: the body is the concatenation of the chunks'
// texts.
type Event struct {
	Schema      string          `json:"schema"`
	ID          uuid.UUID       `json:"id"`
	Kind        Kind            `json:"kind"`
	Key         string          `json:"key"`
	Version     int64           `json:"version"`
	Title       string          `json:"title"`
	Links       []string        `json:"links"`
	Tags        []string        `json:"tags"`
	Meta        json.RawMessage `json:"meta"`
	Chunks      []EventChunk    `json:"chunks"`
	ContentHash string          `json:"content_hash"`
}

// EventChunk is one chunk of a document version, with its derived identity.
type EventChunk struct {
	ID      uuid.UUID `json:"id"`
	Ordinal int       `json:"ordinal"`
	Text    string    `json:"text"`
	Hash    string    `json:"hash"`
}

// NewUpsertedEvent builds the event of a normalised document (see
// [Document.Normalize]) split into chunks, whose concatenation must be the
// body. The result is a pure function of its arguments.
func NewUpsertedEvent(d Document, chunks []string) Event {
	ev := Event{
		Schema:      SchemaV1,
		ID:          EventID(d.Key, d.Version, KindUpserted),
		Kind:        KindUpserted,
		Key:         d.Key,
		Version:     d.Version,
		Title:       d.Title,
		Links:       nonNil(d.Links),
		Tags:        nonNil(d.Tags),
		Meta:        d.Meta,
		Chunks:      make([]EventChunk, len(chunks)),
		ContentHash: ContentHash(d),
	}
	if len(ev.Meta) == 0 {
		ev.Meta = json.RawMessage("{}")
	}
	for i, text := range chunks {
		ev.Chunks[i] = EventChunk{ID: ChunkID(d.Key, d.Version, i), Ordinal: i, Text: text, Hash: TextHash(text)}
	}
	return ev
}

// NewWithdrawnEvent builds the tombstone event of a document version.
func NewWithdrawnEvent(key string, version int64) Event {
	return Event{
		Schema:      SchemaV1,
		ID:          EventID(key, version, KindWithdrawn),
		Kind:        KindWithdrawn,
		Key:         key,
		Version:     version,
		Links:       []string{},
		Tags:        []string{},
		Meta:        json.RawMessage("{}"),
		Chunks:      []EventChunk{},
		ContentHash: WithdrawnHash(key),
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Body reassembles the document body from the chunks.
func (e Event) Body() string {
	var b strings.Builder
	for _, c := range e.Chunks {
		b.WriteString(c.Text)
	}
	return b.String()
}

// Document returns the document an upserted event describes.
func (e Event) Document() Document {
	return Document{Key: e.Key, Version: e.Version, Title: e.Title, Body: e.Body(), Links: e.Links, Tags: e.Tags, Meta: e.Meta}
}

// Encode returns the canonical JSON encoding of the event: fixed field
// order, no HTML escaping, no trailing newline. Encoding a decoded event
// gives back the same bytes.
func (e Event) Encode() ([]byte, error) {
	return e.appendJSON(make([]byte, 0, e.encodedSizeHint()))
}

// DecodeEvent parses and verifies an encoded event. It refuses unknown
// schemas, unknown fields, and any event whose identifiers or content hash
// are not what the contract derives from its own fields, so a projector
// never applies a corrupt or forged event. Errors are *[ValidationError].
func DecodeEvent(data []byte) (Event, error) {
	if len(data) > MaxEventBytes {
		return Event{}, invalid(CodeInvalidEvent, "", "event is %d bytes, more than the limit of %d", len(data), MaxEventBytes)
	}
	if !utf8.Valid(data) {
		return Event{}, invalid(CodeInvalidUTF8, "", "event is not valid UTF-8")
	}
	e, ok := decodeCanonical(data)
	if !ok {
		var err error
		if e, err = decodeStandard(data); err != nil {
			return Event{}, err
		}
	}
	if err := e.Verify(); err != nil {
		return Event{}, err
	}
	return e, nil
}

// decodeStandard decodes data with encoding/json: any layout, unknown
// fields refused.
func decodeStandard(data []byte) (Event, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var e Event
	if err := dec.Decode(&e); err != nil {
		return Event{}, invalid(CodeInvalidJSON, "", "event is not valid JSON of schema %s: %v", SchemaV1, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Event{}, invalid(CodeInvalidJSON, "", "event has data after the JSON object")
	}
	return e, nil
}

// Verify checks every claim the event makes about itself: schema, kind,
// key, version, event id, chunk ids and ordinals, chunk hashes and the
// content hash.
func (e Event) Verify() error {
	if e.Schema != SchemaV1 {
		return invalid(CodeUnknownSchema, "schema", "is %q, this decoder knows only %q", truncate(e.Schema, 64), SchemaV1)
	}
	if e.Kind != KindUpserted && e.Kind != KindWithdrawn {
		return invalid(CodeInvalidEvent, "kind", "is %q, want %q or %q", truncate(string(e.Kind), 64), KindUpserted, KindWithdrawn)
	}
	if err := ValidateKey(e.Key); err != nil {
		return err
	}
	if err := ValidateVersion(e.Version); err != nil {
		return err
	}
	if want := EventID(e.Key, e.Version, e.Kind); e.ID != want {
		return invalid(CodeIdentityMismatch, "id", "is %s, but the contract derives %s", e.ID, want)
	}
	if e.Kind == KindWithdrawn {
		if e.Title != "" || len(e.Links) > 0 || len(e.Tags) > 0 || len(e.Chunks) > 0 || (len(e.Meta) > 0 && string(e.Meta) != "{}") {
			return invalid(CodeInvalidEvent, "kind", "a withdrawal carries no content")
		}
		if want := WithdrawnHash(e.Key); e.ContentHash != want {
			return invalid(CodeIdentityMismatch, "content_hash", "is %q, but a withdrawal's hash is %s", truncate(e.ContentHash, 80), want)
		}
		return nil
	}
	for i, c := range e.Chunks {
		if c.Ordinal != i {
			return invalid(CodeInvalidEvent, "chunks", "chunk %d has ordinal %d", i, c.Ordinal)
		}
		if c.Text == "" {
			return invalid(CodeInvalidEvent, "chunks", "chunk %d is empty", i)
		}
		if want := ChunkID(e.Key, e.Version, i); c.ID != want {
			return invalid(CodeIdentityMismatch, "chunks", "chunk %d has id %s, but the contract derives %s", i, c.ID, want)
		}
		if want := TextHash(c.Text); c.Hash != want {
			return invalid(CodeIdentityMismatch, "chunks", "chunk %d has hash %q, but its text hashes to %s", i, truncate(c.Hash, 80), want)
		}
	}
	if !isHexHash(e.ContentHash) {
		return invalid(CodeInvalidEvent, "content_hash", "must be 64 lowercase hex characters")
	}
	norm, err := e.Document().Normalize()
	if err != nil {
		return err
	}
	if !equalStrings(norm.Links, e.Links) || !equalStrings(norm.Tags, e.Tags) || !bytes.Equal(norm.Meta, e.Meta) {
		return invalid(CodeInvalidEvent, "", "links, tags or meta are not in canonical form")
	}
	if want := ContentHash(norm); e.ContentHash != want {
		return invalid(CodeIdentityMismatch, "content_hash", "is %s, but the content hashes to %s", e.ContentHash, want)
	}
	return nil
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
