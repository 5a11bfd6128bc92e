package auth

import (
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const (
		tokA = "sk_aaaaaaaaaaaaaaaa"
		tokB = "sk_bbbbbbbbbbbbbbbb"
	)
	type want struct {
		name   string
		scopes Scope
	}
	for _, tc := range []struct {
		name    string
		text    string
		want    []want // in file order
		err     error
		errLine int
	}{
		{name: "one token", text: "writer-client write " + tokA + "\n",
			want: []want{{"writer-client", Write}}},
		{name: "comments, blanks, tabs, CRLF, several scopes",
			text: "# the writer's clients\n\n  writer-client\twrite\t" + tokA + "\r\n   # ops\nops admin,read " + tokB,
			want: []want{{"writer-client", Write}, {"ops", Admin | Read}}},
		{name: "a name may repeat (rotation)", text: "c write " + tokA + "\nc write " + tokB + "\n",
			want: []want{{"c", Write}, {"c", Write}}},
		{name: "a scope twice is that scope", text: "c read,read " + tokA, want: []want{{"c", Read}}},
		{name: "duplicate token", text: "a write " + tokA + "\n\nb read " + tokA + "\n", err: ErrDuplicateToken, errLine: 3},
		{name: "unknown scope", text: "a write " + tokA + "\nb delete " + tokB, err: ErrUnknownScope, errLine: 2},
		{name: "empty scope in a list", text: "a write,,read " + tokA, err: ErrUnknownScope, errLine: 1},
		{name: "trailing comma", text: "a write," + " " + tokA, err: ErrUnknownScope, errLine: 1},
		{name: "scopes in upper case", text: "a WRITE " + tokA, err: ErrUnknownScope, errLine: 1},
		{name: "empty token", text: "# x\na write\n", err: ErrEmptyToken, errLine: 2},
		{name: "name alone", text: "a\n", err: ErrMalformedLine, errLine: 1},
		{name: "too many fields", text: "a write " + tokA + " trailing", err: ErrMalformedLine, errLine: 1},
		{name: "token of 15 bytes", text: "a write 123456789012345", err: ErrShortToken, errLine: 1},
		{name: "token of 16 bytes", text: "a write 1234567890123456", want: []want{{"a", Write}}},
		{name: "token with a control character", text: "a write sk_aaaaaaaa\x01aaaaaaaa", err: ErrTokenCharacter, errLine: 1},
		{name: "token with a non-ASCII byte", text: "a write sk_aaaaaaaaaaaaaé", err: ErrTokenCharacter, errLine: 1},
		{name: "only comments", text: "# nothing yet\n\n", err: ErrNoTokens},
		{name: "empty file", text: "", err: ErrNoTokens},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := parse("", []byte(tc.text))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				var le *LineError
				if tc.errLine != 0 && (!errors.As(err, &le) || le.Line != tc.errLine) {
					t.Fatalf("err = %v, want it on line %d", err, tc.errLine)
				}
				for _, tok := range []string{tokA, tokB, "123456789012345", "sk_aaaaaaaa"} {
					if strings.Contains(err.Error(), tok) {
						t.Fatalf("the error %q shows a token", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(set.entries) != len(tc.want) {
				t.Fatalf("%d tokens, want %d", len(set.entries), len(tc.want))
			}
			for i, w := range tc.want {
				if e := set.entries[i]; e.name != w.name || e.scopes != w.scopes {
					t.Errorf("token %d: %s %v, want %s %v", i, e.name, e.scopes, w.name, w.scopes)
				}
			}
		})
	}
}

func TestParseErrorNamesFileAndLine(t *testing.T) {
	_, err := parse("/etc/converge/tokens", []byte("a write sk_aaaaaaaaaaaaaaaa\nb write sk_aaaaaaaaaaaaaaaa\n"))
	if err == nil || !strings.Contains(err.Error(), "/etc/converge/tokens:2") || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("err = %v; want it to name the file, line 2 and the first line", err)
	}
}

// A value as long as a token in the scopes column (the columns swapped) is
// not repeated in the error; a short unknown scope is.
func TestUnknownScopeIsShownOnlyWhenShort(t *testing.T) {
	_, err := parse("", []byte("a sk_cccccccccccccccc write"))
	if !errors.Is(err, ErrUnknownScope) || strings.Contains(err.Error(), "sk_ccc") {
		t.Fatalf("swapped columns: %v", err)
	}
	_, err = parse("", []byte("a delete sk_cccccccccccccccc"))
	if !errors.Is(err, ErrUnknownScope) || !strings.Contains(err.Error(), `"delete"`) {
		t.Fatalf("unknown scope: %v", err)
	}
}

// match compares the digest against every token, wherever the match is,
// and when there is none.
func TestMatchComparesEveryToken(t *testing.T) {
	var text strings.Builder
	toks := []string{"sk_first_aaaaaaaaaaaa", "sk_middle_bbbbbbbbbbb", "sk_last_ccccccccccccc"}
	for i, tok := range toks {
		text.WriteString("client" + string(rune('a'+i)) + " write " + tok + "\n")
	}
	set, err := parse("", []byte(text.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		token string
		index int
	}{{toks[0], 0}, {toks[1], 1}, {toks[2], 2}, {"sk_unknown_ddddddddd", -1}, {"sk_first_aaaaaaaaaab", -1}, {"", -1}} {
		i, compared := set.match(sha256.Sum256([]byte(tc.token)))
		if i != tc.index || compared != len(toks) {
			t.Errorf("match(%q) = %d after %d comparisons, want %d after %d", tc.token, i, compared, tc.index, len(toks))
		}
	}
}

func TestScopeNames(t *testing.T) {
	s, err := ParseScopes("read,admin,write")
	if err != nil || s != Read|Admin|Write || s.String() != "write,admin,read" {
		t.Fatalf("ParseScopes = %v (%s), %v", s, s, err)
	}
	if _, err := ParseScopes(""); !errors.Is(err, ErrUnknownScope) {
		t.Fatalf("empty scopes: %v", err)
	}
}
