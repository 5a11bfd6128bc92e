package chunking

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Algorithm names the chunking algorithm. Chunk ids depend on it: change it
// whenever Split may produce different chunks for some body.
const Algorithm = "converge.chunking.v1"

// minBytes is the smallest allowed size bound. The last-resort cut backs up at
// most utf8.UTFMax bytes from the limit, so a chunk always makes progress.
const minBytes = utf8.UTFMax * 4

// Config bounds chunk sizes in bytes.
type Config struct {
	TargetBytes int // preferred chunk size; chunks are packed up to about this size
	MaxBytes    int // hard maximum; no chunk is ever longer
}

// DefaultConfig returns the configuration used by the pipeline.
func DefaultConfig() Config {
	return Config{TargetBytes: 1024, MaxBytes: 4096}
}

// Validate returns an error naming the offending field if c cannot be passed
// to Split.
func (c Config) Validate() error {
	if c.TargetBytes < minBytes {
		return fmt.Errorf("chunking: TargetBytes must be at least %d, got %d", minBytes, c.TargetBytes)
	}
	if c.MaxBytes < minBytes {
		return fmt.Errorf("chunking: MaxBytes must be at least %d, got %d", minBytes, c.MaxBytes)
	}
	if c.MaxBytes < c.TargetBytes {
		return fmt.Errorf("chunking: MaxBytes (%d) must be at least TargetBytes (%d)", c.MaxBytes, c.TargetBytes)
	}
	return nil
}

// Split cuts body into chunks as described in the package documentation. The
// chunks are substrings of body, and strings.Join(chunks, "") == body. An
// empty body gives no chunks.
//
// Split panics if cfg is invalid; callers check it with Config.Validate.
func Split(body string, cfg Config) []string {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if body == "" {
		return nil
	}
	p := packer{
		body:   body,
		target: cfg.TargetBytes,
		max:    cfg.MaxBytes,
		out:    make([]string, 0, len(body)/cfg.TargetBytes+1),
	}
	p.blocks()
	p.flush()
	return p.out
}

// Unit levels used to cut a block larger than MaxBytes, coarsest first.
const (
	levelLine = iota
	levelSentence
	levelWord
	levelRune
)

// packer accumulates the current chunk body[start:end]. Units are handed over
// in order and contiguously, so end is also the start of the next unit.
type packer struct {
	body        string
	target, max int
	start, end  int
	out         []string
}

// flush emits the current chunk, if any, and starts an empty one at end.
func (p *packer) flush() {
	if p.end > p.start {
		p.out = append(p.out, p.body[p.start:p.end])
	}
	p.start = p.end
}

// add appends body[p.end:end], at most MaxBytes long, to the current chunk or
// starts a new chunk with it.
func (p *packer) add(end int, heading bool) {
	if n := p.end - p.start; n > 0 && (end-p.start > p.target || heading && n >= p.target/4) {
		p.flush()
	}
	p.end = end
}

// block hands over the block body[p.end:end].
func (p *packer) block(end int, heading bool) {
	if end-p.end <= p.max {
		p.add(end, heading)
		return
	}
	p.flush()
	p.split(end, levelLine)
}

// blocks reads the body line by line and hands over its blocks.
func (p *packer) blocks() {
	body := p.body
	content := false   // the current block has a non-blank line
	heading := false   // the current block begins with a heading
	pending := false   // a blank line or closing fence ended the current block's content
	var fenceChar byte // fence character while inside a fence, 0 outside
	var fenceLen int   // length of the opening fence
	for pos := 0; pos < len(body); {
		next := len(body)
		if i := strings.IndexByte(body[pos:], '\n'); i >= 0 {
			next = pos + i + 1
		}
		line := body[pos:next]
		switch {
		case fenceChar != 0:
			if closesFence(line, fenceChar, fenceLen) {
				fenceChar = 0
				pending = true
			}
		case isBlank(line):
			pending = content
		default:
			isHeading := isATXHeading(line)
			c, n := openingFence(line)
			if !content {
				heading = isHeading
			} else if pending || isHeading || n > 0 {
				p.block(pos, heading)
				heading = isHeading
			}
			content = true
			pending = false
			fenceChar, fenceLen = c, n
		}
		pos = next
	}
	p.block(len(body), heading)
}

// split hands over body[p.end:end], which is larger than MaxBytes, as units
// of the given level; units still larger than MaxBytes go one level down.
func (p *packer) split(end, level int) {
	if level == levelRune {
		p.splitRunes(end)
		return
	}
	for p.end < end {
		u := unitEnd(p.body[:end], p.end, level)
		if u-p.end > p.max {
			p.split(u, level+1)
		} else {
			p.add(u, false)
		}
	}
}

// unitEnd returns the end of the unit of the given level that starts at i.
func unitEnd(s string, i, level int) int {
	switch level {
	case levelLine:
		if k := strings.IndexByte(s[i:], '\n'); k >= 0 {
			return i + k + 1
		}
	case levelSentence:
		for j := i + 1; j < len(s); {
			k := strings.IndexByte(s[j:], ' ')
			if k < 0 {
				break
			}
			j += k
			if c := s[j-1]; c == '.' || c == '!' || c == '?' {
				return j + 1
			}
			j++
		}
	case levelWord:
		for j := i; j < len(s); j++ {
			if s[j] == ' ' || s[j] == '\t' {
				return j + 1
			}
		}
	}
	return len(s)
}

// splitRunes hands over body[p.end:end] by filling chunks up to TargetBytes,
// cutting where no valid UTF-8 sequence is split.
func (p *packer) splitRunes(end int) {
	for p.end < end {
		if end-p.start <= p.target {
			p.end = end
			return
		}
		cut := safeCut(p.body, p.start+p.target, p.end)
		if cut <= p.end {
			// The current chunk is too full for even one rune; an empty chunk
			// always has room, since cuts back up less than minBytes.
			p.flush()
			continue
		}
		p.end = cut
		p.flush()
	}
}

// safeCut returns the last position at or before limit and not before lo
// that is a boundary of the rune-by-rune decoding of s (so not inside a valid
// UTF-8 sequence), moved back from between "\r" and "\n". A return value of lo
// means there is none after lo. lo must itself be such a boundary and
// limit < len(s).
func safeCut(s string, limit, lo int) int {
	// A valid sequence is a start byte and at most UTFMax-1 continuation bytes,
	// so only the nearest start byte in that window can make limit an inner
	// position; without one, limit is among stray continuation bytes, which
	// decode one by one.
	for q := limit; q >= lo && q > limit-utf8.UTFMax; q-- {
		if !utf8.RuneStart(s[q]) {
			continue
		}
		if q < limit {
			if _, n := utf8.DecodeRuneInString(s[q:]); q+n <= limit {
				return limit
			}
			return q
		}
		if s[q] == '\n' && q > lo && s[q-1] == '\r' {
			return q - 1
		}
		return q
	}
	return limit
}

// isBlank reports whether line holds only spaces, tabs and line endings.
func isBlank(line string) bool {
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case ' ', '\t', '\r', '\n':
		default:
			return false
		}
	}
	return true
}

// indent returns the number of leading spaces of line, up to three (more makes
// an indented code line in markdown).
func indent(line string) int {
	i := 0
	for i < 3 && i < len(line) && line[i] == ' ' {
		i++
	}
	return i
}

// isATXHeading reports whether line is a markdown ATX heading.
func isATXHeading(line string) bool {
	i := indent(line)
	j := i
	for j < len(line) && line[j] == '#' {
		j++
	}
	if n := j - i; n < 1 || n > 6 {
		return false
	}
	if j == len(line) {
		return true
	}
	switch line[j] {
	case ' ', '\t', '\n':
		return true
	case '\r':
		return j+1 == len(line) || line[j+1] == '\n'
	}
	return false
}

// openingFence returns the character and length of the code fence that line
// opens, or a zero length if it opens none.
func openingFence(line string) (byte, int) {
	i := indent(line)
	if i == len(line) || line[i] != '`' && line[i] != '~' {
		return 0, 0
	}
	c := line[i]
	j := i
	for j < len(line) && line[j] == c {
		j++
	}
	if j-i < 3 {
		return 0, 0
	}
	// A backtick fence's info string cannot hold a backtick; such a line is
	// inline code, as in CommonMark.
	if c == '`' && strings.IndexByte(line[j:], '`') >= 0 {
		return 0, 0
	}
	return c, j - i
}

// closesFence reports whether line closes a fence of n characters c.
func closesFence(line string, c byte, n int) bool {
	i := indent(line)
	j := i
	for j < len(line) && line[j] == c {
		j++
	}
	return j-i >= n && isBlank(line[j:])
}
