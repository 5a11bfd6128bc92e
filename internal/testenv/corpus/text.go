package corpus

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode"
)

// The vocabularies mix ASCII, accents, scripts of several widths, emoji and
// markup, so that bodies, tags and meta exercise chunking, escaping and
// normalization.
var (
	words = []string{
		"the", "writer", "stores", "every", "document", "version", "once", "and", "only", "once",
		"idempotent", "ingestion", "replay", "retry", "outbox", "chunk", "event", "freshness", "guard",
		"natural", "key", "upsert", "checksum", "table", "row", "load", "twice", "same", "result",
		"naïve", "façade", "Grüße", "東京", "данные", "λόγος", "🙂", "<script>", "&amp;", "50%",
		"a/b", "`code`", "**bold**", "_italic_", "über", "mañana", "数据库", "クエリ", "😀👍",
	}
	sections = []string{"guide", "ref", "api", "howto", "faq", "blog", "notes", "spec"}
	uniWords = []string{"données", "Straße", "日本語", "русский", "ελληνικά", "العربية", "emoji😀", "中文"}
	tagVocab = []string{
		"go", "postgres", "idempotency", "идемпотентность", "日本", "release-notes", "how to",
		"a/b", "?", "100%", "draft", "🚀", "x.y.z", "Ünïcode", "<b>", "tag with spaces",
	}
)

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func sentence(rng *rand.Rand, minW, maxW int) string {
	n := minW + rng.IntN(maxW-minW+1)
	ws := make([]string, n)
	for i := range ws {
		ws[i] = pick(rng, words)
	}
	r := []rune(strings.Join(ws, " "))
	r[0] = unicode.ToUpper(r[0])
	return string(r) + "."
}

func paragraph(rng *rand.Rand) string {
	n := 1 + rng.IntN(5)
	ss := make([]string, n)
	for i := range ss {
		ss[i] = sentence(rng, 4, 18)
	}
	return strings.Join(ss, " ")
}

// body is empty (8%), a markdown text of 20 bytes to 12 KB (89%; one in
// twenty with CRLF line ends), one long line without a blank (2%), or one
// enormous word of multi-byte runes (1%): the chunker's every way to split.
func body(rng *rand.Rand) string {
	r := rng.IntN(100)
	var target int
	switch {
	case r < 8:
		return ""
	case r < 50:
		target = 20 + rng.IntN(800)
	case r < 85:
		target = 1000 + rng.IntN(2500)
	case r < 97:
		target = 4000 + rng.IntN(8000)
	case r < 99:
		// One long line without a blank: split by sentences and words.
		var b strings.Builder
		for b.Len() < 5000+rng.IntN(3000) {
			b.WriteString(sentence(rng, 5, 25) + " ")
		}
		return b.String()
	default:
		// One enormous word of multi-byte runes: split by runes.
		return strings.Repeat(pick(rng, uniWords), 400+rng.IntN(400))
	}
	var blocks []string
	size := 0
	if rng.IntN(2) == 0 {
		blocks = append(blocks, "# "+sentence(rng, 2, 6))
	}
	for size < target {
		var blk string
		switch rng.IntN(10) {
		case 0:
			blk = "## " + sentence(rng, 2, 6)
		case 1:
			var items []string
			for range 3 + rng.IntN(6) {
				items = append(items, "- "+sentence(rng, 3, 10))
			}
			blk = strings.Join(items, "\n")
		case 2:
			var lines []string
			for range 2 + rng.IntN(10) {
				lines = append(lines, "\tx := "+strconv.Quote(sentence(rng, 1, 5)))
			}
			blk = "```go\n" + strings.Join(lines, "\n") + "\n```"
		case 3:
			blk = "> " + paragraph(rng)
		default:
			blk = paragraph(rng)
		}
		blocks = append(blocks, blk)
		size += len(blk) + 2
	}
	b := strings.Join(blocks, "\n\n") + "\n"
	if rng.IntN(20) == 0 {
		b = strings.ReplaceAll(b, "\n", "\r\n")
	}
	return b
}

func title(rng *rand.Rand) string {
	if rng.IntN(10) == 0 {
		return ""
	}
	return strings.TrimSuffix(sentence(rng, 1, 8), ".")
}

// meta is absent, empty, not canonical (unsorted keys, white space), or an
// object of numbers, strings, booleans, arrays and nested objects.
func meta(rng *rand.Rand) json.RawMessage {
	switch rng.IntN(10) {
	case 0:
		return nil
	case 1:
		return json.RawMessage(`{}`)
	case 2:
		return json.RawMessage(fmt.Sprintf(`{ "z": %d, "a": {"y": [1, 2.5, "x"], "b": null}, "m": "<&> ü" }`, rng.IntN(100)))
	}
	m := map[string]any{"rev": rng.IntN(1000)}
	if rng.IntN(2) == 0 {
		m["author"] = pick(rng, words)
	}
	if rng.IntN(2) == 0 {
		m["score"] = float64(rng.IntN(400)) / 4
	}
	if rng.IntN(3) == 0 {
		m["draft"] = rng.IntN(2) == 0
	}
	if rng.IntN(3) == 0 {
		m["labels"] = []any{pick(rng, tagVocab), pick(rng, words), rng.IntN(10)}
	}
	if rng.IntN(4) == 0 {
		m["nested"] = map[string]any{"depth": 1, "ü": "ß", "inner": map[string]any{"k": nil}}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}
