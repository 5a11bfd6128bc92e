package corpus

import (
	"strings"
	"unicode/utf8"

	"github.com/converge-sync/converge/pkg/contract"
)

// SpecialKeys need careful URL escaping: url.PathEscape keeps each one a
// single path segment. Pairs like "a/b" and "a%2Fb" collide if a client or
// the server escapes or unescapes once too often or too little.
// ("." and ".." are left out: as path segments they are dot-segments that
// any URL normaliser removes.) "max/version" and "big/version" get versions
// at [math.MaxInt64] and beyond float64 precision in a [Generate]d corpus.
// Every corpus holds them all, first, in this order.
var SpecialKeys = []string{
	"a/b", "a%2Fb", "a%252Fb", "a b", "a%20b", "a+b", "a?b", "a%3Fb", "a#b",
	"docs/guide/intro.md", "docs//double//slashes", "/leading/slash", "trailing/slash/",
	"dots/../parent", "dots/./same", "x..y", "v1.2.3", "...", "file.tar.gz",
	"100% done", "%", "%%", "%zz", "%E2%82%AC", "?", "??", "what?", "q?x=1&y=2#frag",
	" leading space", "trailing space ", "  multiple   spaces  ",
	"ünïcødé", "日本語/文書/テスト", "emoji 🚀/launch", "ZWJ 👩‍💻 coder", "עברית/מסמך",
	"e\u0301 combining", "line\u2028separator", "bom\ufeffinside", "Ελληνικά.txt",
	"semi;colon,comma", "colon:at@dollar$", `back\slash`, `quote"s`, "apostrophe's",
	"<tag>&amp;", "~tilde*star(paren)[bracket]{brace}", "mixed/ü ?%.md",
	"max/version", "big/version",
	LongKey(),
}

// LongKey is exactly contract.MaxKeyBytes bytes, mostly two-byte runes.
func LongKey() string {
	k := "long/" + strings.Repeat("ключ/", 100)
	for len(k) > contract.MaxKeyBytes {
		_, size := utf8.DecodeLastRuneInString(k)
		k = k[:len(k)-size]
	}
	return k + strings.Repeat("x", contract.MaxKeyBytes-len(k))
}
