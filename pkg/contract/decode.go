package contract

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Events arrive in their canonical encoding (Event.Encode, which the writer
// stores in the outbox and the relay publishes verbatim), and encoding/json
// spends most of a projector's decoding time on reflection and on growing
// its read buffer. decodeCanonical reads that one layout directly and
// proves its result by encoding it again: only when the encoding gives back
// the input, byte for byte, is the result taken. Anything else (another
// field order, whitespace, an escape the encoder would not write, a null
// where a list was expected) falls back to encoding/json, which then accepts
// or rejects the input as it always did. The canonical encoding is one to
// one, so an accepted result is the event encoding/json decodes from the
// same bytes; FuzzDecodeCanonicalMatchesStandard checks it.

// decodeCanonical decodes data if it is an event's canonical encoding.
func decodeCanonical(data []byte) (Event, bool) {
	d := canonDecoder{data: data, ok: true}
	var e Event
	d.lit(`{"schema":`)
	e.Schema = d.str()
	d.lit(`,"id":`)
	e.ID = d.uuid()
	d.lit(`,"kind":`)
	e.Kind = Kind(d.str())
	d.lit(`,"key":`)
	e.Key = d.str()
	d.lit(`,"version":`)
	e.Version = d.int()
	d.lit(`,"title":`)
	e.Title = d.str()
	d.lit(`,"links":`)
	e.Links = d.strs()
	d.lit(`,"tags":`)
	e.Tags = d.strs()
	d.lit(`,"meta":`)
	e.Meta = d.object()
	d.lit(`,"chunks":`)
	e.Chunks = list(&d, d.chunk)
	d.lit(`,"content_hash":`)
	e.ContentHash = d.str()
	d.lit("}")
	if !d.ok || d.i != len(data) {
		return Event{}, false
	}
	bp := encodeBuffers.Get().(*[]byte)
	enc, err := e.appendJSON((*bp)[:0])
	same := err == nil && bytes.Equal(enc, data)
	if cap(enc) <= maxPooledEncoding {
		*bp = enc
		encodeBuffers.Put(bp)
	}
	if !same {
		return Event{}, false
	}
	return e, true
}

// encodeBuffers hold the re-encodings of decodeCanonical; one grown past
// maxPooledEncoding by a large event is left to the collector rather than
// kept.
var encodeBuffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledEncoding = 64 << 10

// canonDecoder reads data from i on; once ok is false every read returns a
// zero value and the decode is abandoned.
type canonDecoder struct {
	data []byte
	i    int
	ok   bool
	buf  []byte // unescaped string scratch
}

func (d *canonDecoder) fail() { d.ok, d.i = false, len(d.data) }

func (d *canonDecoder) lit(s string) {
	if !d.ok || !bytes.HasPrefix(d.data[d.i:], []byte(s)) {
		d.fail()
		return
	}
	d.i += len(s)
}

func (d *canonDecoder) peek(b byte) bool {
	if d.i < len(d.data) && d.data[d.i] == b {
		d.i++
		return true
	}
	return false
}

// raw returns the bytes of the string at i, unescaped, and moves past it.
// The result is d.data itself when the string has no escape, else d.buf.
func (d *canonDecoder) raw() []byte {
	if !d.ok || !d.peek('"') {
		d.fail()
		return nil
	}
	start := d.i
	q := bytes.IndexByte(d.data[d.i:], '"')
	if q < 0 {
		d.fail()
		return nil
	}
	if bs := bytes.IndexByte(d.data[d.i:d.i+q], '\\'); bs >= 0 {
		d.i += bs
		return d.unescape(start)
	}
	d.i += q + 1
	return d.data[start : d.i-1]
}

// unescape finishes a string with escapes: d.i is at the first backslash.
func (d *canonDecoder) unescape(start int) []byte {
	d.buf = append(d.buf[:0], d.data[start:d.i]...)
	for {
		rest := d.data[d.i:]
		q := bytes.IndexByte(rest, '"')
		if q < 0 {
			d.fail()
			return nil
		}
		bs := bytes.IndexByte(rest[:q], '\\')
		if bs < 0 {
			d.buf = append(d.buf, rest[:q]...)
			d.i += q + 1
			return d.buf
		}
		d.buf = append(d.buf, rest[:bs]...)
		d.i += bs
		if !d.escape() {
			d.fail()
			return nil
		}
	}
}

// escape appends the escape sequence at d.i (a backslash) to d.buf and
// moves past it.
func (d *canonDecoder) escape() bool {
	if d.i+1 >= len(d.data) {
		return false
	}
	switch esc := d.data[d.i+1]; esc {
	case '"', '\\':
		d.buf = append(d.buf, esc)
	case 'b':
		d.buf = append(d.buf, '\b')
	case 'f':
		d.buf = append(d.buf, '\f')
	case 'n':
		d.buf = append(d.buf, '\n')
	case 'r':
		d.buf = append(d.buf, '\r')
	case 't':
		d.buf = append(d.buf, '\t')
	case 'u':
		r, ok := d.hex4(d.i + 2)
		if !ok {
			return false
		}
		width := 6
		if utf16.IsSurrogate(r) {
			r2, ok := d.hex4(d.i + 8)
			if !ok || d.data[d.i+6] != '\\' || d.data[d.i+7] != 'u' {
				return false
			}
			if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
				return false
			}
			width = 12
		}
		d.buf = utf8.AppendRune(d.buf, r)
		d.i += width
		return true
	default:
		return false // "\/" and the like: not what the encoder writes
	}
	d.i += 2
	return true
}

// hex4 reads the four hex digits at i as a rune.
func (d *canonDecoder) hex4(i int) (rune, bool) {
	if i+4 > len(d.data) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d.data[i:i+4]), 16, 16)
	return rune(v), err == nil
}

func (d *canonDecoder) str() string { return string(d.raw()) }

func (d *canonDecoder) uuid() uuid.UUID {
	u, err := uuid.ParseBytes(d.raw())
	if err != nil {
		d.fail()
	}
	return u
}

func (d *canonDecoder) int() int64 {
	start := d.i
	for d.i < len(d.data) && (d.data[d.i] == '-' || d.data[d.i] >= '0' && d.data[d.i] <= '9') {
		d.i++
	}
	v, err := strconv.ParseInt(string(d.data[start:d.i]), 10, 64)
	if !d.ok || err != nil {
		d.fail()
	}
	return v
}

// strs reads a list of strings.
func (d *canonDecoder) strs() []string { return list(d, d.str) }

// chunk reads one chunk of the list of chunks.
func (d *canonDecoder) chunk() EventChunk {
	var c EventChunk
	d.lit(`{"id":`)
	c.ID = d.uuid()
	d.lit(`,"ordinal":`)
	c.Ordinal = int(d.int())
	d.lit(`,"text":`)
	c.Text = d.str()
	d.lit(`,"hash":`)
	c.Hash = d.str()
	d.lit("}")
	return c
}

// list reads a list whose elements elem reads: never nil (null, which
// encoding/json would decode to a nil list, is left to it).
func list[T any](d *canonDecoder, elem func() T) []T {
	if !d.ok || !d.peek('[') {
		d.fail()
		return nil
	}
	out := []T{}
	for d.ok && !d.peek(']') {
		if len(out) > 0 {
			d.lit(",")
		}
		out = append(out, elem())
	}
	return out
}

// object reads a JSON object as raw bytes (a copy): up to its closing
// brace, outside strings. Whether it is valid JSON is left to the
// re-encoding, which compacts the meta and fails on anything invalid.
func (d *canonDecoder) object() json.RawMessage {
	if !d.ok || d.i >= len(d.data) || d.data[d.i] != '{' {
		d.fail()
		return nil
	}
	start, depth := d.i, 0
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			d.raw()
			if !d.ok {
				return nil
			}
			continue
		}
		d.i++
		if depth == 0 {
			return bytes.Clone(d.data[start:d.i])
		}
	}
	d.fail()
	return nil
}
