package contract

// The reflection-based implementations the hand-written encoders replaced,
// kept verbatim as the definition of the canonical bytes. The parity tests
// compare the two.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// referenceEncode is Event.Encode through encoding/json.
func referenceEncode(e Event) ([]byte, error) {
	var buf bytes.Buffer
	text := referenceEstimateText(e.Chunks)
	buf.Grow(512 + 2*len(e.Title) + len(e.Meta) + 200*len(e.Chunks) + text + text/8)
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func referenceEstimateText(cs []EventChunk) int {
	n := 0
	for _, c := range cs {
		n += len(c.Text)
	}
	return n
}

// referenceCanonicalDocument fixes the field order of the hashed form.
type referenceCanonicalDocument struct {
	Key   string          `json:"key"`
	Title string          `json:"title"`
	Body  string          `json:"body"`
	Links []string        `json:"links"`
	Tags  []string        `json:"tags"`
	Meta  json.RawMessage `json:"meta"`
}

// referenceContentHashInput returns the bytes ContentHash streamed into the
// hash through encoding/json.
func referenceContentHashInput(d Document) []byte {
	var h bytes.Buffer
	enc := json.NewEncoder(referenceTrimNewline{&h})
	enc.SetEscapeHTML(false)
	meta := d.Meta
	if len(meta) == 0 {
		meta = json.RawMessage("{}")
	}
	links, tags := d.Links, d.Tags
	if links == nil {
		links = []string{}
	}
	if tags == nil {
		tags = []string{}
	}
	_ = enc.Encode(referenceCanonicalDocument{Key: d.Key, Title: d.Title, Body: d.Body, Links: links, Tags: tags, Meta: meta})
	return h.Bytes()
}

func referenceContentHash(d Document) string {
	sum := sha256.Sum256(referenceContentHashInput(d))
	return hex.EncodeToString(sum[:])
}

type referenceTrimNewline struct{ w io.Writer }

func (t referenceTrimNewline) Write(p []byte) (int, error) {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		if _, err := t.w.Write(p[:n-1]); err != nil {
			return 0, err
		}
		return n, nil
	}
	return t.w.Write(p)
}

// referenceCanonicalMeta is CanonicalMeta through a decoded any.
// referenceCanonicalMeta is the reference definition plus the one rule added
// since: numbers Postgres cannot store are refused.
func referenceCanonicalMeta(raw json.RawMessage) (json.RawMessage, error) {
	out, err := referenceCanonicalMetaUnchecked(raw)
	if err != nil {
		return nil, err
	}
	if err := checkMetaNumbers(out); err != nil {
		return nil, err
	}
	return out, nil
}

func referenceCanonicalMetaUnchecked(raw json.RawMessage) (json.RawMessage, error) {
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
	if referenceHasNUL(v) {
		return nil, invalid(CodeNULCharacter, "meta", "has a NUL character in a string")
	}
	return referenceCanonicalJSON(v)
}

func referenceHasNUL(v any) bool {
	switch t := v.(type) {
	case string:
		return strings.IndexByte(t, 0) >= 0
	case []any:
		return slices.ContainsFunc(t, referenceHasNUL)
	case map[string]any:
		for k, e := range t {
			if strings.IndexByte(k, 0) >= 0 || referenceHasNUL(e) {
				return true
			}
		}
	}
	return false
}

func referenceCanonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, invalid(CodeInvalidMeta, "meta", "cannot be encoded: %v", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// referenceRawMessage is how encoding/json encodes a json.RawMessage field
// of an event.
func referenceRawMessage(m json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
