package contract

import (
	"bytes"
	"encoding/json"
	"io"
	"math/bits"
	"reflect"
	"strconv"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The canonical encodings were defined by encoding/json (SetEscapeHTML(false),
// struct fields in declaration order). They are written by hand here because
// reflection dominated the writer's per-document cost; the functions below
// reproduce encoding/json's output byte for byte, which the reference tests
// and FuzzCanonicalEncodingMatchesReference check.

const hexDigits = "0123456789abcdef"

// asciiStop marks the ASCII bytes encoding/json escapes in a string.
var asciiStop = func() (t [utf8.RuneSelf]bool) {
	for b := range utf8.RuneSelf {
		t[b] = b < 0x20 || b == '"' || b == '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// load64 reads s[i:i+8] as a little-endian word; the compiler makes it
// one load.
func load64[S string | []byte](s S, i int) uint64 {
	b := s[i : i+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// lookMask has the high bit set in each byte of x that is < 0x20, '"',
// '\\' or non-ASCII, the bytes safeRun must look at. It uses hasless and
// haszero from "Bit Twiddling Hacks"; flipping bit 1 first maps '"' (0x22)
// to 0x20 and keeps 0x00-0x1F below 0x20, so one hasless(y, 0x21) finds
// both. A borrow can flag a byte above a flagged one, never below: the
// lowest flagged byte is always a real one.
func lookMask(x uint64) uint64 {
	y := x ^ (lsb * 0x02)
	ctlQuote := (y - lsb*0x21) &^ y
	z := x ^ (lsb * '\\')
	backslash := (z - lsb) &^ z
	return (x | ctlQuote | backslash) & msb
}

// safeRun returns the end of the run from s[i:] that encoding/json copies
// verbatim: ASCII other than the escaped bytes, and valid UTF-8 other than
// U+2028 and U+2029. It goes 16 bytes at a time to the next byte that needs
// a look.
func safeRun[S string | []byte](s S, i int) int {
	for i+16 <= len(s) {
		lo, hi := lookMask(load64(s, i)), lookMask(load64(s, i+8))
		switch {
		case lo|hi == 0:
			i += 16
			continue
		case lo != 0:
			i += bits.TrailingZeros64(lo) >> 3
		default:
			i += 8 + bits.TrailingZeros64(hi)>>3
		}
		if s[i] < utf8.RuneSelf {
			return i // a flagged ASCII byte is always one to escape
		}
		c, size := decodeRune(s, i)
		if (c == utf8.RuneError && size == 1) || c == '\u2028' || c == '\u2029' {
			return i
		}
		i += size
	}
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiStop[b] {
				return i
			}
			i++
			continue
		}
		c, size := decodeRune(s, i)
		if (c == utf8.RuneError && size == 1) || c == '\u2028' || c == '\u2029' {
			return i
		}
		i += size
	}
	return i
}

// decodeRune decodes the rune at s[i]. Converting at most UTFMax bytes keeps
// a []byte's conversion on the stack, as in encoding/json.
func decodeRune[S string | []byte](s S, i int) (rune, int) {
	return utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
}

// appendEscape appends the escape of the rune at s[i], where safeRun
// stopped, and returns the index after it. The cases are encoding/json's
// appendString's.
func appendEscape[S string | []byte](dst []byte, s S, i int) ([]byte, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		switch b {
		case '\\', '"':
			dst = append(dst, '\\', b)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
		}
		return dst, i + 1
	}
	switch c, size := decodeRune(s, i); {
	case c == '\u2028' || c == '\u2029':
		// encoding/json escapes these even without HTML escaping.
		return append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF]), i + size
	case c == utf8.RuneError && size == 1:
		// Invalid UTF-8, a byte at a time, as encoding/json replaces it.
		return append(dst, `\ufffd`...), i + 1
	default:
		return append(dst, s[i:i+size]...), i + size
	}
}

// appendString appends s as a JSON string, as encoding/json does with HTML
// escaping off.
func appendString[S string | []byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	for i := 0; ; {
		j := safeRun(s, i)
		dst = append(dst, s[i:j]...)
		if j == len(s) {
			break
		}
		dst, i = appendEscape(dst, s, j)
	}
	return append(dst, '"')
}

// appendStrings appends a []string: null when nil, as encoding/json does.
func appendStrings(dst []byte, ss []string) []byte {
	if ss == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, s)
	}
	return append(dst, ']')
}

// appendUUID appends u quoted in its canonical 36-character form, which is
// what encoding/json writes through uuid.UUID's MarshalText.
func appendUUID(dst []byte, u uuid.UUID) []byte {
	dst = append(dst, '"')
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst = append(dst, '-')
		}
		dst = append(dst, hexDigits[b>>4], hexDigits[b&0xF])
	}
	return append(dst, '"')
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// appendRaw appends a json.RawMessage as encoding/json does: null when nil,
// otherwise compacted, and an error (the same *json.MarshalerError) when it
// is not valid JSON, including when it is empty but not nil.
func appendRaw(dst []byte, m json.RawMessage) ([]byte, error) {
	if m == nil {
		return append(dst, "null"...), nil
	}
	if out, ok := compactFast(dst, m); ok {
		return out, nil
	}
	buf := bytes.NewBuffer(dst)
	if err := json.Compact(buf, m); err != nil {
		return dst, &json.MarshalerError{Type: rawMessageType, Err: err}
	}
	return buf.Bytes(), nil
}

// encodedSizeHint is the encoded size when nothing needs escaping, plus
// some room for escapes, so that one allocation usually suffices.
func (e Event) encodedSizeHint() int {
	n := 192 + len(e.Schema) + len(e.Kind) + len(e.Key) + len(e.Title) + len(e.Meta) + len(e.ContentHash)
	for _, s := range e.Links {
		n += len(s) + 3
	}
	for _, s := range e.Tags {
		n += len(s) + 3
	}
	text := 0
	for _, c := range e.Chunks {
		n += 96 + len(c.Hash)
		text += len(c.Text)
	}
	return n + text + text/16
}

// appendJSON appends the canonical encoding of e: encoding/json's encoding
// of the Event struct.
func (e Event) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"schema":`...)
	b = appendString(b, e.Schema)
	b = append(b, `,"id":`...)
	b = appendUUID(b, e.ID)
	b = append(b, `,"kind":`...)
	b = appendString(b, string(e.Kind))
	b = append(b, `,"key":`...)
	b = appendString(b, e.Key)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, e.Version, 10)
	b = append(b, `,"title":`...)
	b = appendString(b, e.Title)
	b = append(b, `,"links":`...)
	b = appendStrings(b, e.Links)
	b = append(b, `,"tags":`...)
	b = appendStrings(b, e.Tags)
	b = append(b, `,"meta":`...)
	b, err := appendRaw(b, e.Meta)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"chunks":`...)
	if e.Chunks == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, c := range e.Chunks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendUUID(b, c.ID)
			b = append(b, `,"ordinal":`...)
			b = strconv.AppendInt(b, int64(c.Ordinal), 10)
			b = append(b, `,"text":`...)
			b = appendString(b, c.Text)
			b = append(b, `,"hash":`...)
			b = appendString(b, c.Hash)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"content_hash":`...)
	b = appendString(b, e.ContentHash)
	return append(b, '}'), nil
}

// Size of the staging buffer through which the canonical document streams
// into the hash: a large body is hashed in pieces, never copied whole.
const stageSize = 2048

// docWriter streams the canonical JSON of a document into w through a
// fixed staging buffer.
type docWriter struct {
	w   io.Writer
	buf []byte // len 0, cap stageSize
}

func (dw *docWriter) flush() {
	if len(dw.buf) > 0 {
		_, _ = dw.w.Write(dw.buf) // a hash never fails
		dw.buf = dw.buf[:0]
	}
}

// raw writes s verbatim.
func (dw *docWriter) raw(s string) {
	for {
		n := min(len(s), cap(dw.buf)-len(dw.buf))
		dw.buf = append(dw.buf, s[:n]...)
		if s = s[n:]; s == "" {
			return
		}
		dw.flush()
	}
}

// string writes s as appendString encodes it.
func (dw *docWriter) string(s string) {
	dw.raw(`"`)
	for i := 0; ; {
		j := safeRun(s, i)
		dw.raw(s[i:j])
		if j == len(s) {
			break
		}
		if cap(dw.buf)-len(dw.buf) < utf8.UTFMax+2 { // room for any escape
			dw.flush()
		}
		dw.buf, i = appendEscape(dw.buf, s, j)
	}
	dw.raw(`"`)
}

func (dw *docWriter) strings(ss []string) {
	dw.raw("[")
	for i, s := range ss {
		if i > 0 {
			dw.raw(",")
		}
		dw.string(s)
	}
	dw.raw("]")
}

// writeCanonicalDocument writes the canonical JSON of d's content to w, as
// encoding/json encodes a struct of key, title, body, links, tags and meta
// in this order, with nil links and tags as [] and empty meta as {}. The meta is
// compacted first: when it is not valid JSON, encoding/json fails before
// writing anything, so nothing is written and ok is false. meta and stage
// are scratch buffers, returned for reuse.
func writeCanonicalDocument(w io.Writer, meta, stage []byte, d Document) (_, _ []byte, ok bool) {
	meta = meta[:0]
	if len(d.Meta) == 0 {
		meta = append(meta, "{}"...)
	} else {
		var err error
		if meta, err = appendRaw(meta, d.Meta); err != nil {
			return meta, stage, false
		}
	}
	meta = append(meta, '}')
	if cap(stage) < stageSize {
		stage = make([]byte, 0, stageSize)
	}
	dw := docWriter{w: w, buf: stage[:0:stageSize]}
	dw.raw(`{"key":`)
	dw.string(d.Key)
	dw.raw(`,"title":`)
	dw.string(d.Title)
	dw.raw(`,"body":`)
	dw.string(d.Body)
	dw.raw(`,"links":`)
	dw.strings(d.Links)
	dw.raw(`,"tags":`)
	dw.strings(d.Tags)
	dw.raw(`,"meta":`)
	dw.flush()
	_, _ = w.Write(meta)
	return meta, stage, true
}
