package auth

import (
	"strings"
	"testing"
)

// FuzzParse: the parser never panics, and its errors never repeat a value
// of the file as long as a token, whichever column it is in.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"writer-client write sk_aaaaaaaaaaaaaaaa\n",
		"# c\n\nops admin,read sk_bbbbbbbbbbbbbbbb\r\nx write sk_bbbbbbbbbbbbbbbb",
		"a sk_cccccccccccccccc write",
		"a write,admin,, sk_dddddddddddddddd",
		"a write sk_eeeeee\x00eeeeeeeee",
		"a\tread\t1234567890123456 extra",
		"a write",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		set, err := parse("", []byte(text))
		if err != nil {
			if set != nil {
				t.Fatal("a set with an error")
			}
			msg := err.Error()
			for line := range strings.Lines(text) {
				for _, field := range strings.Fields(line) {
					if len(field) >= MinTokenBytes && strings.Contains(msg, field) {
						t.Fatalf("the error %q repeats %q of the file", msg, field)
					}
				}
			}
			return
		}
		if len(set.entries) == 0 {
			t.Fatal("no tokens and no error")
		}
		for _, e := range set.entries {
			if e.name == "" || e.scopes == 0 {
				t.Fatalf("entry %+v", e)
			}
		}
	})
}
