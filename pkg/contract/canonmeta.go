package contract

import (
	"bytes"
	"slices"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// The canonical form of meta is defined by decoding it with encoding/json
// (UseNumber) into an any and encoding that with sorted map keys (see
// canonicalMetaDecoded). canonicalMetaFast produces the same bytes in one
// pass without building the tree, for the inputs it fully understands: a
// single valid JSON object, at most maxFastDepth deep, without NUL in any
// string. For anything else it gives up and CanonicalMeta takes the decoding
// path, which then also words the error exactly as before.
// FuzzCanonicalMetaMatchesReference checks the two agree.
//
// The same parser, in verbatim mode, compacts a json.RawMessage for the
// event encoding (compactFast): strings copied as written, members in input
// order, any JSON value; json.Compact remains the definition and handles
// whatever the fast path does not.

// maxFastDepth bounds the nesting the fast path handles. Reordering an
// unsorted object copies its members once per enclosing level, so deep
// input would cost depth × size; real metadata is shallow.
const maxFastDepth = 32

// metaMember is one member of an object being canonicalised: its unescaped
// key, at keys[k0:k1], and its encoded `"key":value` at out[start:end].
type metaMember struct {
	k0, k1     int
	start, end int
}

type metaCanon struct {
	verbatim bool // compact only, see compactFast
	in       []byte
	pos      int
	out      []byte
	depth    int
	members  []metaMember // a stack: each open object owns a suffix
	keys     []byte       // unescaped keys of the members on the stack
	scratch  []byte       // unescaped strings; members while reordering
}

var metaCanons = sync.Pool{New: func() any { return new(metaCanon) }}

// canonicalMetaFast canonicalises in, which is trimmed valid UTF-8, and
// reports whether it could.
func canonicalMetaFast(in []byte) ([]byte, bool) {
	if len(in) == 0 || in[0] != '{' {
		return nil, false
	}
	c := metaCanons.Get().(*metaCanon)
	defer c.release()
	// Removing white space usually makes the output shorter; escaping
	// U+2028 and U+2029 can make it longer, and append grows it then.
	c.in, c.out = in, make([]byte, 0, len(in)+16)
	if !c.value() {
		return nil, false
	}
	c.skipSpace()
	if c.pos != len(c.in) {
		return nil, false
	}
	return slices.Clip(c.out), true
}

// compactFast appends src to dst without insignificant white space, as
// json.Compact does, and reports whether it could: src must be one valid
// JSON value, at most maxFastDepth deep. On failure dst is returned as
// given.
func compactFast(dst, src []byte) ([]byte, bool) {
	c := metaCanons.Get().(*metaCanon)
	defer c.release()
	c.verbatim, c.in, c.out = true, src, dst
	if !c.value() {
		return dst, false
	}
	c.skipSpace()
	if c.pos != len(c.in) {
		return dst, false
	}
	return c.out, true
}

// release returns c to the pool, keeping its scratch space but no reference
// to the input or output.
func (c *metaCanon) release() {
	*c = metaCanon{members: c.members[:0], keys: c.keys[:0], scratch: c.scratch[:0]}
	if cap(c.scratch) > 64<<10 || cap(c.keys) > 64<<10 {
		return // do not pool what one large meta grew
	}
	metaCanons.Put(c)
}

// isSpace is JSON's white space, the only kind encoding/json skips.
func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

func (c *metaCanon) skipSpace() {
	for c.pos < len(c.in) && isSpace(c.in[c.pos]) {
		c.pos++
	}
}

// value copies one value from in to out in canonical form.
func (c *metaCanon) value() bool {
	c.skipSpace()
	if c.pos >= len(c.in) {
		return false
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		if c.verbatim {
			return c.verbatimStr()
		}
		s, ok := c.str()
		if ok {
			c.out = appendString(c.out, s)
		}
		return ok
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	}
	return false
}

func (c *metaCanon) literal(lit string) bool {
	if end := c.pos + len(lit); end > len(c.in) || string(c.in[c.pos:end]) != lit {
		return false
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return true
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// number copies a number as written (json.Number), after checking it has
// JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *metaCanon) number() bool {
	in, i := c.in, c.pos
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && isDigit(in[i]):
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(in) && in[i] == '.' {
		i++
		if i >= len(in) || !isDigit(in[i]) {
			return false
		}
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if i >= len(in) || !isDigit(in[i]) {
			return false
		}
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	}
	c.out = append(c.out, in[c.pos:i]...)
	c.pos = i
	return true
}

func (c *metaCanon) array() bool {
	if c.depth++; c.depth > maxFastDepth {
		return false
	}
	c.pos++ // [
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return true
	}
	for {
		if !c.value() {
			return false
		}
		c.skipSpace()
		if c.pos >= len(c.in) {
			return false
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return true
		default:
			return false
		}
	}
}

func (c *metaCanon) object() bool {
	if c.depth++; c.depth > maxFastDepth {
		return false
	}
	c.pos++ // {
	open := len(c.out)
	c.out = append(c.out, '{')
	base, keysBase := len(c.members), len(c.keys)
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return true
	}
	sorted := true
	for {
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return false
		}
		if c.verbatim {
			if !c.verbatimStr() {
				return false
			}
			ok, last := c.member()
			if !ok {
				return false
			}
			if last {
				break
			}
			c.out = append(c.out, ',')
			continue
		}
		key, ok := c.str()
		if !ok {
			return false
		}
		m := metaMember{k0: len(c.keys), start: len(c.out)}
		c.keys = append(c.keys, key...)
		m.k1 = len(c.keys)
		if n := len(c.members); n > base {
			prev := c.members[n-1]
			sorted = sorted && bytes.Compare(c.keys[prev.k0:prev.k1], c.keys[m.k0:m.k1]) < 0
		}
		c.out = appendString(c.out, key)
		i := len(c.members)
		c.members = append(c.members, m)
		ok, last := c.member()
		if !ok {
			return false
		}
		c.members[i].end = len(c.out)
		if last {
			break
		}
		c.out = append(c.out, ',')
	}
	if !sorted {
		c.reorder(open, c.members[base:])
	}
	c.out = append(c.out, '}')
	c.members, c.keys = c.members[:base], c.keys[:keysBase]
	c.depth--
	return true
}

// member reads the rest of an object member after its key, writing the
// colon and the value, then reads the comma or closing brace that follows
// and reports which.
func (c *metaCanon) member() (ok, last bool) {
	c.skipSpace()
	if c.pos >= len(c.in) || c.in[c.pos] != ':' {
		return false, false
	}
	c.pos++
	c.out = append(c.out, ':')
	if !c.value() {
		return false, false
	}
	c.skipSpace()
	if c.pos >= len(c.in) {
		return false, false
	}
	switch c.in[c.pos] {
	case '}':
		c.pos++
		return true, true
	case ',':
		c.pos++
		return true, false
	}
	return false, false
}

// reorder rewrites the members of the object opened at out[open] sorted by
// key, keeping only the last of members with the same key, as a Go map
// filled in input order and encoded by encoding/json would.
func (c *metaCanon) reorder(open int, ms []metaMember) {
	key := func(m metaMember) []byte { return c.keys[m.k0:m.k1] }
	// Stable: equal keys stay in input order, so the last one is the winner.
	slices.SortStableFunc(ms, func(a, b metaMember) int { return bytes.Compare(key(a), key(b)) })
	body := open + 1
	c.scratch = append(c.scratch[:0], c.out[body:]...)
	c.out = c.out[:body]
	for i, m := range ms {
		if i+1 < len(ms) && bytes.Equal(key(m), key(ms[i+1])) {
			continue // a later member has the same key
		}
		if len(c.out) > body {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[m.start-body:m.end-body]...)
	}
}

// str reads a string at in[pos] and returns it unescaped, as encoding/json's
// unquote does. It fails on invalid JSON and on a NUL character, which
// CanonicalMeta refuses. The result aliases in or scratch, and is valid
// until the next call.
func (c *metaCanon) str() ([]byte, bool) {
	in := c.in
	start := c.pos + 1
	i := start
	for i < len(in) && in[i] != '"' && in[i] != '\\' {
		if in[i] < 0x20 {
			return nil, false
		}
		i++
	}
	if i >= len(in) {
		return nil, false
	}
	if in[i] == '"' { // no escapes: the string is its own bytes
		c.pos = i + 1
		return in[start:i], true
	}
	u := append(c.scratch[:0], in[start:i]...)
	for {
		if i >= len(in) {
			return nil, false
		}
		switch b := in[i]; {
		case b == '"':
			c.pos = i + 1
			c.scratch = u
			return u, true
		case b < 0x20:
			return nil, false
		case b != '\\':
			u = append(u, b)
			i++
			continue
		}
		if i+1 >= len(in) {
			return nil, false
		}
		switch e := in[i+1]; e {
		case '"', '\\', '/':
			u = append(u, e)
		case 'b':
			u = append(u, '\b')
		case 'f':
			u = append(u, '\f')
		case 'n':
			u = append(u, '\n')
		case 'r':
			u = append(u, '\r')
		case 't':
			u = append(u, '\t')
		case 'u':
			r := hex4(in[i:])
			if r < 0 {
				return nil, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// A valid pair is one rune; any other surrogate is U+FFFD,
				// and what follows it is read on its own.
				if d := utf16.DecodeRune(r, hex4(in[i:])); d != utf8.RuneError {
					r = d
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			if r == 0 {
				return nil, false
			}
			u = utf8.AppendRune(u, r)
			continue
		default:
			return nil, false
		}
		i += 2
	}
}

// verbatimStr copies a string at in[pos] as written, after checking it as
// encoding/json's scanner does: no control characters, only JSON's escapes.
// Other bytes, even invalid UTF-8, pass as they do through json.Compact.
func (c *metaCanon) verbatimStr() bool {
	in := c.in
	for i := c.pos + 1; i < len(in); i++ {
		b := in[i]
		if b >= utf8.RuneSelf || !asciiStop[b] {
			continue
		}
		switch {
		case b == '"':
			c.out = append(c.out, in[c.pos:i+1]...)
			c.pos = i + 1
			return true
		case b < 0x20:
			return false
		case b == '\\':
			if i+1 >= len(in) {
				return false
			}
			switch in[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if hex4(in[i:]) < 0 {
					return false
				}
				i += 5
			default:
				return false
			}
		}
	}
	return false
}

// hex4 decodes a \uXXXX escape at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, b := range s[2:6] {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return -1
		}
		r = r*16 + rune(b)
	}
	return r
}
