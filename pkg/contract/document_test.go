package contract_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

func TestContentHashKnownAnswer(t *testing.T) {
	d, err := contract.Document{
		Key: "docs/intro.md", Version: 3, Title: "Intro", Body: "Hello <world> & friends\n",
		Links: []string{"b", "a", "b"}, Tags: []string{"x"},
		Meta: json.RawMessage(`{ "z": "é", "a": [1, 2.5] }`),
	}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	// Python: sha256(json.dumps(canonical, separators=(',',':'), ensure_ascii=False))
	const want = "1456d2c679b2d282cfd49c229dfdaf3c61f95d228b8bae77306d463a31b3af9e"
	if got := contract.ContentHash(d); got != want {
		t.Fatalf("content hash %s, want %s", got, want)
	}
	if string(d.Meta) != `{"a":[1,2.5],"z":"é"}` {
		t.Fatalf("canonical meta %s", d.Meta)
	}
	if strings.Join(d.Links, ",") != "a,b" {
		t.Fatalf("links not a sorted set: %v", d.Links)
	}
	d2 := d
	d2.Version = 99
	if contract.ContentHash(d2) != want {
		t.Fatal("the version must not enter the content hash")
	}
	d2.Title = "Intro!"
	if contract.ContentHash(d2) == want {
		t.Fatal("a title change must change the content hash")
	}
}

func TestNormalizeRejects(t *testing.T) {
	ok := contract.Document{Key: "k", Version: 1}
	tests := []struct {
		name     string
		mutate   func(*contract.Document)
		code     string
		tooLarge bool
	}{
		{"empty key", func(d *contract.Document) { d.Key = "" }, contract.CodeMissingKey, false},
		{"long key", func(d *contract.Document) { d.Key = strings.Repeat("k", contract.MaxKeyBytes+1) }, contract.CodeKeyTooLong, false},
		{"control char in key", func(d *contract.Document) { d.Key = "a\nb" }, contract.CodeKeyControlChar, false},
		{"DEL in key", func(d *contract.Document) { d.Key = "a\x7fb" }, contract.CodeKeyControlChar, false},
		{"invalid utf8 key", func(d *contract.Document) { d.Key = "a\xffb" }, contract.CodeInvalidUTF8, false},
		{"zero version", func(d *contract.Document) { d.Version = 0 }, contract.CodeInvalidVersion, false},
		{"negative version", func(d *contract.Document) { d.Version = -5 }, contract.CodeInvalidVersion, false},
		{"body too large", func(d *contract.Document) { d.Body = strings.Repeat("x", contract.MaxBodyBytes+1) }, contract.CodeBodyTooLarge, true},
		{"NUL in body", func(d *contract.Document) { d.Body = "a\x00b" }, contract.CodeNULCharacter, false},
		{"invalid utf8 title", func(d *contract.Document) { d.Title = "\xc3" }, contract.CodeInvalidUTF8, false},
		{"meta not an object", func(d *contract.Document) { d.Meta = json.RawMessage(`[1]`) }, contract.CodeInvalidMeta, false},
		{"meta not json", func(d *contract.Document) { d.Meta = json.RawMessage(`{"a":`) }, contract.CodeInvalidMeta, false},
		{"meta trailing data", func(d *contract.Document) { d.Meta = json.RawMessage(`{} {}`) }, contract.CodeInvalidMeta, false},
		{"meta NUL", func(d *contract.Document) { d.Meta = json.RawMessage(`{"a":"\u0000"}`) }, contract.CodeNULCharacter, false},
		{"meta number beyond numeric", func(d *contract.Document) { d.Meta = json.RawMessage(`{"a":[1e200000]}`) }, contract.CodeInvalidMeta, false},
		{"meta number too small for numeric", func(d *contract.Document) { d.Meta = json.RawMessage(`{"a":{"b":-1e-200000}}`) }, contract.CodeInvalidMeta, false},
		{"bad link", func(d *contract.Document) { d.Links = []string{"ok", ""} }, contract.CodeInvalidLink, false},
		{"too many links", func(d *contract.Document) { d.Links = make([]string, contract.MaxLinks+1) }, contract.CodeTooManyLinks, true},
		{"empty tag", func(d *contract.Document) { d.Tags = []string{""} }, contract.CodeInvalidTag, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := ok
			tt.mutate(&d)
			_, err := d.Normalize()
			var ve *contract.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a *ValidationError", err)
			}
			if ve.Code != tt.code {
				t.Fatalf("code = %s, want %s (%v)", ve.Code, tt.code, err)
			}
			if ve.TooLarge() != tt.tooLarge {
				t.Fatalf("TooLarge() = %v, want %v", ve.TooLarge(), tt.tooLarge)
			}
			if !errors.Is(err, contract.ErrInvalid) {
				t.Fatal("errors.Is(err, ErrInvalid) is false")
			}
		})
	}
	if _, err := ok.Normalize(); err != nil {
		t.Fatalf("minimal document rejected: %v", err)
	}
}
