package chunking

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"
)

// checkChunks asserts the properties every result of Split must have.
func checkChunks(t testing.TB, body string, cfg Config, chunks []string) {
	t.Helper()
	if body == "" && len(chunks) != 0 {
		t.Fatalf("empty body gave %d chunks", len(chunks))
	}
	boundary := decodeBoundaries(body)
	valid := utf8.ValidString(body)
	off := 0
	for i, c := range chunks {
		if c == "" {
			t.Fatalf("chunk %d is empty", i)
		}
		if len(c) > cfg.MaxBytes {
			t.Fatalf("chunk %d has %d bytes, more than MaxBytes %d", i, len(c), cfg.MaxBytes)
		}
		if len(c) > len(body)-off || body[off:off+len(c)] != c {
			t.Fatalf("chunk %d at offset %d does not match the body: %q", i, off, c)
		}
		if unsafe.StringData(c) != unsafe.StringData(body[off:]) {
			t.Fatalf("chunk %d is a copy, not a substring of the body", i)
		}
		if valid && !utf8.ValidString(c) {
			t.Fatalf("chunk %d is not valid UTF-8: %q", i, c)
		}
		off += len(c)
		if !boundary[off] {
			t.Fatalf("chunk %d ends at offset %d inside a valid UTF-8 sequence", i, off)
		}
	}
	if off != len(body) {
		t.Fatalf("chunks cover %d of %d bytes", off, len(body))
	}
	if got := strings.Join(chunks, ""); got != body {
		t.Fatalf("chunks do not reassemble the body")
	}
}

// decodeBoundaries marks the offsets between the runes (valid sequences or
// single invalid bytes) that utf8.DecodeRuneInString steps over.
func decodeBoundaries(s string) []bool {
	b := make([]bool, len(s)+1)
	for i := 0; i < len(s); {
		b[i] = true
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	b[len(s)] = true
	return b
}

// checkSplit runs Split twice and checks the result and its determinism.
func checkSplit(t testing.TB, body string, cfg Config) []string {
	t.Helper()
	chunks := Split(body, cfg)
	checkChunks(t, body, cfg, chunks)
	if again := Split(body, cfg); !slices.Equal(chunks, again) {
		t.Fatalf("Split is not deterministic for %q", body)
	}
	return chunks
}

func TestDefaultConfig(t *testing.T) {
	cfg := DefaultConfig()
	if cfg != (Config{TargetBytes: 1024, MaxBytes: 4096}) {
		t.Fatalf("DefaultConfig() = %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg   Config
		field string // named in the error; empty if valid
	}{
		{Config{TargetBytes: 16, MaxBytes: 16}, ""},
		{Config{TargetBytes: 16, MaxBytes: 1 << 30}, ""},
		{Config{TargetBytes: 15, MaxBytes: 64}, "TargetBytes"},
		{Config{TargetBytes: 0, MaxBytes: 0}, "TargetBytes"},
		{Config{TargetBytes: -1, MaxBytes: 64}, "TargetBytes"},
		{Config{TargetBytes: 64, MaxBytes: 63}, "MaxBytes"},
		{Config{TargetBytes: 16, MaxBytes: 8}, "MaxBytes"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%+v: Validate() = %v, want nil", tt.cfg, err)
		case tt.field != "" && err == nil:
			t.Errorf("%+v: Validate() = nil, want an error naming %s", tt.cfg, tt.field)
		case tt.field != "" && !strings.Contains(err.Error(), tt.field):
			t.Errorf("%+v: Validate() = %v, want it to name %s", tt.cfg, err, tt.field)
		}
	}
}

func TestSplitPanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Split with an invalid Config did not panic")
		}
	}()
	Split("body", Config{TargetBytes: 8, MaxBytes: 8})
}

func TestSplitEmpty(t *testing.T) {
	if got := Split("", DefaultConfig()); len(got) != 0 {
		t.Fatalf("Split(\"\") = %q, want no chunks", got)
	}
}

func TestSplitTable(t *testing.T) {
	small := Config{TargetBytes: 16, MaxBytes: 64}
	tests := []struct {
		name string
		body string
		cfg  Config
		want []string
	}{
		{"single byte", "x", small, []string{"x"}},
		{"blank only", "\n\n\r\n \t\n", small, []string{"\n\n\r\n \t\n"}},
		{"leading blank lines join the first block", "\n\n\nx\n", small, []string{"\n\n\nx\n"}},
		{
			"paragraphs packed up to target",
			"aaa\n\nbbb\n\nccc\n\n", Config{TargetBytes: 32, MaxBytes: 64},
			[]string{"aaa\n\nbbb\n\nccc\n\n"},
		},
		{
			"paragraphs keep trailing blank lines",
			"one two three\n\nfour five six\n\n\n", small,
			[]string{"one two three\n\n", "four five six\n\n\n"},
		},
		{
			"whitespace-only line separates paragraphs",
			"first paragraph\n \t \nsecond one\n", small,
			[]string{"first paragraph\n \t \n", "second one\n"},
		},
		{
			"heading starts a chunk",
			"intro text here.\n\n# Head\nbody\n", Config{TargetBytes: 64, MaxBytes: 128},
			[]string{"intro text here.\n\n", "# Head\nbody\n"},
		},
		{
			"heading joins a small chunk",
			"hi\n\n# Head\nbody\n", Config{TargetBytes: 64, MaxBytes: 128},
			[]string{"hi\n\n# Head\nbody\n"},
		},
		{
			"heading interrupts a paragraph",
			"some text line\n## H\nmore\n", small,
			[]string{"some text line\n", "## H\nmore\n"},
		},
		{
			"heading at the end without newline",
			"text\n#", small,
			[]string{"text\n", "#"},
		},
		{
			"not headings",
			"#hashtag\n####### seven\n    # code\n", small,
			[]string{"#hashtag\n####### seven\n    # code\n"},
		},
		{
			"indented heading",
			"paragraph text\n   ### h\n", small,
			[]string{"paragraph text\n", "   ### h\n"},
		},
		{
			"fence is one block",
			"```\na\n\nb\n\n# not heading\n```\nafter\n", small,
			[]string{"```\na\n\nb\n\n# not heading\n```\n", "after\n"},
		},
		{
			"fence closes only with a long enough fence",
			"````go\nx\n\n```\n\ny\n````\n\nz\n", Config{TargetBytes: 16, MaxBytes: 32},
			[]string{"````go\nx\n\n```\n\ny\n````\n\n", "z\n"},
		},
		{
			"unclosed tilde fence interrupts a paragraph",
			"some paragraph\n~~~\n\n\ncode\n", small,
			[]string{"some paragraph\n", "~~~\n\n\ncode\n"},
		},
		{
			"inline triple backticks are not a fence",
			"```inline``` text\n\nnext paragraph\n", small,
			[]string{"```inline``` text\n\n", "next paragraph\n"},
		},
		{
			"oversized fence split at lines",
			"```\nline one\n\nline two\nline three\n```\n", Config{TargetBytes: 16, MaxBytes: 32},
			[]string{"```\nline one\n\n", "line two\n", "line three\n```\n"},
		},
		{
			"lists",
			"- a\n- b\n- c\n\n1. x\n2. y\n", small,
			[]string{"- a\n- b\n- c\n\n", "1. x\n2. y\n"},
		},
		{
			"CRLF",
			"first para\r\n\r\nsecond para\r\n\r\n# H\r\ntext\r\n", small,
			[]string{"first para\r\n\r\n", "second para\r\n\r\n", "# H\r\ntext\r\n"},
		},
		{
			"CRLF heading and fence",
			"xyz\r\n#\r\n```\r\n\r\n```\r\nafter\r\n", Config{TargetBytes: 16, MaxBytes: 16},
			[]string{"xyz\r\n", "#\r\n```\r\n\r\n```\r\n", "after\r\n"},
		},
		{
			"sentences",
			"One two three. Four five six! Seven eight nine? Ten eleven twelve.\n",
			Config{TargetBytes: 32, MaxBytes: 40},
			[]string{"One two three. Four five six! ", "Seven eight nine? ", "Ten eleven twelve.\n"},
		},
		{
			"words",
			"alpha beta gamma delta epsilon zeta\n", Config{TargetBytes: 16, MaxBytes: 20},
			[]string{"alpha beta ", "gamma delta ", "epsilon zeta\n"},
		},
		{
			"long line without spaces",
			strings.Repeat("x", 40), Config{TargetBytes: 16, MaxBytes: 16},
			[]string{strings.Repeat("x", 16), strings.Repeat("x", 16), strings.Repeat("x", 8)},
		},
		{
			"CJK crossing the limit",
			"あいうえおかきくけこ", Config{TargetBytes: 16, MaxBytes: 16},
			[]string{"あいうえお", "かきくけこ"},
		},
		{
			"emoji on the limit",
			strings.Repeat("😀", 10), Config{TargetBytes: 16, MaxBytes: 18},
			[]string{"😀😀😀😀", "😀😀😀😀", "😀😀"},
		},
		{
			"emoji crossing the limit",
			"ab😀😀😀😀😀", Config{TargetBytes: 16, MaxBytes: 18},
			[]string{"ab😀😀😀", "😀😀"},
		},
		{
			"CRLF kept whole by the last-resort cut",
			strings.Repeat("x", 15) + "\r\n", Config{TargetBytes: 16, MaxBytes: 16},
			[]string{strings.Repeat("x", 15), "\r\n"},
		},
		{
			"stray continuation bytes",
			strings.Repeat("\x80", 20), Config{TargetBytes: 16, MaxBytes: 16},
			[]string{strings.Repeat("\x80", 16), strings.Repeat("\x80", 4)},
		},
		{
			"valid rune among invalid bytes ends before the limit",
			strings.Repeat("\x80", 14) + "é" + strings.Repeat("\x80", 5), Config{TargetBytes: 16, MaxBytes: 16},
			[]string{strings.Repeat("\x80", 14) + "é", strings.Repeat("\x80", 5)},
		},
		{
			"valid rune among invalid bytes crosses the limit",
			strings.Repeat("\xff", 15) + "é" + "\xff", Config{TargetBytes: 16, MaxBytes: 16},
			[]string{strings.Repeat("\xff", 15), "é\xff"},
		},
		{
			"truncated sequence before a valid one",
			"\xe4\xb8" + strings.Repeat("中", 6), Config{TargetBytes: 16, MaxBytes: 16},
			[]string{"\xe4\xb8中中中中", "中中"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkSplit(t, tt.body, tt.cfg)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Split(%q, %+v)\n got %q\nwant %q", tt.body, tt.cfg, got, tt.want)
			}
		})
	}
}

// propertyConfigs covers the edges of Config (equal bounds, the minimum,
// bounds that do not divide rune sizes) and typical values.
var propertyConfigs = []Config{
	{TargetBytes: 16, MaxBytes: 16},
	{TargetBytes: 16, MaxBytes: 17},
	{TargetBytes: 17, MaxBytes: 19},
	{TargetBytes: 19, MaxBytes: 64},
	{TargetBytes: 33, MaxBytes: 33},
	{TargetBytes: 64, MaxBytes: 256},
	{TargetBytes: 100, MaxBytes: 101},
	{TargetBytes: 257, MaxBytes: 1000},
	DefaultConfig(),
}

func TestSplitProperties(t *testing.T) {
	gens := []struct {
		name string
		gen  func(r *rand.Rand, size int) string
	}{
		{"markdown", genMarkdown},
		{"utf8", genUTF8},
		{"whitespace", genWhitespace},
		{"bytes", genBytes},
	}
	for _, g := range gens {
		t.Run(g.name, func(t *testing.T) {
			for seed := range uint64(150) {
				r := rand.New(rand.NewPCG(seed, 0x636f6e7665726765))
				body := g.gen(r, r.IntN(6000))
				cfgs := append(slices.Clone(propertyConfigs), randomConfig(r), randomConfig(r))
				for _, cfg := range cfgs {
					chunks := checkSplit(t, body, cfg)
					checkLineEnds(t, body, cfg, chunks)
				}
			}
		})
	}
}

// TestSplitLargeBodies covers bodies near the pipeline's size limit.
func TestSplitLargeBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("large bodies")
	}
	r := rand.New(rand.NewPCG(7, 7))
	for _, size := range []int{1 << 20, 4 << 20} {
		body := genMarkdown(r, size)
		for _, cfg := range []Config{DefaultConfig(), {TargetBytes: 16, MaxBytes: 16}} {
			chunks := checkSplit(t, body, cfg)
			checkLineEnds(t, body, cfg, chunks)
		}
	}
}

// checkLineEnds asserts that, when no line is longer than MaxBytes, chunks
// are cut only between lines: blocks end at line ends and an oversized block
// is first cut at line ends.
func checkLineEnds(t testing.TB, body string, cfg Config, chunks []string) {
	t.Helper()
	for line := range strings.Lines(body) {
		if len(line) > cfg.MaxBytes {
			return
		}
	}
	for i, c := range chunks[:max(len(chunks)-1, 0)] {
		if !strings.HasSuffix(c, "\n") {
			t.Fatalf("chunk %d does not end a line though no line exceeds MaxBytes: %q", i, c)
		}
	}
}

func randomConfig(r *rand.Rand) Config {
	target := minBytes + r.IntN(300)
	return Config{TargetBytes: target, MaxBytes: target + r.IntN(3)*r.IntN(300)}
}

// words mixes ASCII, accented, combining, CJK, emoji and ZWJ sequences, and
// sentence punctuation.
var words = []string{
	"the", "converge", "sync", "a", "chunk", "is", "naïve", "e\u0301", "Ω",
	"κόσμος", "数据", "東京は日本の首都です。", "한국어", "😀", "👩\u200d💻", "🇯🇵",
	"end.", "why?", "yes!", "a.b", "x#y", "`code`", "~~~", "```", "#",
}

func genWords(r *rand.Rand, b *strings.Builder, n int) {
	for i := range n {
		if i > 0 {
			b.WriteString([]string{" ", " ", " ", "  ", "\t"}[r.IntN(5)])
		}
		b.WriteString(words[r.IntN(len(words))])
	}
}

func eol(r *rand.Rand) string {
	if r.IntN(4) == 0 {
		return "\r\n"
	}
	return "\n"
}

// genMarkdown generates markdown-like text of about size bytes: headings
// (valid and not), paragraphs, lists, fences (some unclosed), blank-line
// runs, long tokens without spaces, and random text.
func genMarkdown(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		switch r.IntN(12) {
		case 0:
			b.WriteString(strings.Repeat(" ", r.IntN(5)))
			b.WriteString(strings.Repeat("#", 1+r.IntN(7)))
			if r.IntN(5) > 0 {
				b.WriteString([]string{" ", "\t", ""}[r.IntN(3)])
				genWords(r, &b, r.IntN(8))
			}
			b.WriteString(eol(r))
		case 1:
			fence := strings.Repeat([]string{"`", "~"}[r.IntN(2)], 3+r.IntN(2))
			b.WriteString(fence + []string{"", "go", "sh"}[r.IntN(3)] + eol(r))
			for range r.IntN(12) {
				if r.IntN(3) == 0 {
					b.WriteString(eol(r))
					continue
				}
				genWords(r, &b, r.IntN(10))
				b.WriteString(eol(r))
			}
			if r.IntN(8) > 0 {
				b.WriteString(fence + eol(r))
			}
		case 2:
			for i := range 1 + r.IntN(6) {
				b.WriteString([]string{"- ", "* ", fmt.Sprintf("%d. ", i+1)}[r.IntN(3)])
				genWords(r, &b, 1+r.IntN(10))
				b.WriteString(eol(r))
			}
		case 3:
			for range 1 + r.IntN(4) {
				b.WriteString([]string{"", " ", "\t", "  \t"}[r.IntN(4)] + eol(r))
			}
		case 4:
			unit := []string{"x", "é", "中", "😀", "\r"}[r.IntN(5)]
			b.WriteString(strings.Repeat(unit, r.IntN(700)))
		case 5:
			b.WriteString(genUTF8(r, r.IntN(200)))
		default:
			for range 1 + r.IntN(5) {
				genWords(r, &b, 1+r.IntN(40))
				b.WriteString(eol(r))
			}
			if r.IntN(3) > 0 {
				b.WriteString(eol(r))
			}
		}
	}
	return b.String()
}

// genUTF8 generates valid UTF-8 of about size bytes from runes of every
// encoded length, with some whitespace and line breaks.
func genUTF8(r *rand.Rand, size int) string {
	ranges := [][2]rune{
		{0x20, 0x7e}, {'\t', '\r'}, {0x80, 0x7ff}, {0x800, 0xd7ff},
		{0xe000, 0xffff}, {0x10000, 0x10ffff}, {0x1f300, 0x1faff}, {0x4e00, 0x9fff},
	}
	var b strings.Builder
	for b.Len() < size {
		rg := ranges[r.IntN(len(ranges))]
		b.WriteRune(rg[0] + r.Int32N(rg[1]-rg[0]+1))
	}
	return b.String()
}

// genWhitespace generates runs of whitespace and line endings with a few
// short tokens between them.
func genWhitespace(r *rand.Rand, size int) string {
	parts := []string{" ", "\t", "\n", "\r\n", "\r", "\n\n", "\r\n\r\n", "x", "# ", "```", ". ", "😀"}
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(strings.Repeat(parts[r.IntN(len(parts))], 1+r.IntN(40)))
	}
	return b.String()
}

// genBytes generates arbitrary bytes, biased towards UTF-8 lead and
// continuation bytes and pieces of valid sequences.
func genBytes(r *rand.Rand, size int) string {
	b := make([]byte, 0, size+8)
	for len(b) < size {
		switch r.IntN(4) {
		case 0:
			b = append(b, byte(r.IntN(256)))
		case 1:
			b = append(b, byte(0x80+r.IntN(64)))
		case 2:
			const pieces = "\n\n. # é中😀"
			b = append(b, pieces[r.IntN(len(pieces))])
		default:
			b = utf8.AppendRune(b, rune(r.IntN(0x110000)))
		}
	}
	return string(b)
}

// TestSplitAllocs checks that Split allocates only its result slice (and its
// growth), never per chunk.
func TestSplitAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation counts")
	}
	body := genMarkdown(rand.New(rand.NewPCG(1, 2)), 1<<20)
	cfg := DefaultConfig()
	n := len(Split(body, cfg))
	allocs := testing.AllocsPerRun(5, func() { Split(body, cfg) })
	if allocs > 8 {
		t.Fatalf("Split made %v allocations for %d chunks", allocs, n)
	}
}

// FuzzSplit takes the bounds as bytes: small bounds reach every cutting level
// on short bodies, and wider integers make minimizing inputs slow.
func FuzzSplit(f *testing.F) {
	f.Add("", uint8(0), uint8(0))
	f.Add("# Title\n\nSome text.\n\n## Section\nMore text. And more!\n", uint8(0), uint8(16))
	f.Add("```go\nfunc main() {\n\n}\n```\n\nafter\r\n\r\n# H\r\n", uint8(4), uint8(0))
	f.Add(strings.Repeat("😀", 40)+"\n", uint8(1), uint8(2))
	f.Add("東京は日本の首都です。 "+strings.Repeat("あ", 30), uint8(3), uint8(5))
	f.Add("\xe4\xb8\xe4\xb8\xad\x80\x80\xff\r\n\r\n", uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, body string, target, extra uint8) {
		cfg := Config{TargetBytes: minBytes + int(target)}
		cfg.MaxBytes = cfg.TargetBytes + int(extra)
		chunks := checkSplit(t, body, cfg)
		checkLineEnds(t, body, cfg, chunks)
	})
}

func BenchmarkSplit(b *testing.B) {
	body := genMarkdown(rand.New(rand.NewPCG(1, 2)), 1<<20)
	cfg := DefaultConfig()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Split(body, cfg)
	}
}
