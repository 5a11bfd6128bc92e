package contract

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodeSamples are events as writers produce them: escapes of every kind
// the encoder writes, multi-byte and astral runes, U+2028, lists of several
// strings and empty ones, a nested meta, a withdrawal.
func decodeSamples(t testing.TB) [][]byte {
	t.Helper()
	docs := []Document{
		{Key: "docs/intro.md", Version: 3, Title: "Intro", Body: "# Intro\n\nHello <world> & friends\n",
			Links: []string{"docs/next.md", "docs/a.md", "z"}, Tags: []string{"guide", "intro"}, Meta: json.RawMessage(`{"lang":"en"}`)},
		{Key: "k/ü/😀", Version: 9007199254740993, Title: "tab\there \"quoted\" back\\slash \u2028 \u2029 \x01\x1f",
			Body: "line\r\nfeed\f\b é 😀 日本語\n", Meta: json.RawMessage(`{"b":{"d":1,"c":[true,false,null]},"a":"\u2028\n{}[]","n":-1.5e3}`)},
		{Key: "empty", Version: 1, Body: "x"},
	}
	var out [][]byte
	for _, d := range docs {
		norm, err := d.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		half := len(norm.Body) / 2
		for half > 0 && !utf8.RuneStart(norm.Body[half]) {
			half--
		}
		chunks := []string{norm.Body}
		if half > 0 {
			chunks = []string{norm.Body[:half], norm.Body[half:]}
		}
		out = append(out, mustEncode(t, NewUpsertedEvent(norm, chunks)))
	}
	return append(out, mustEncode(t, NewWithdrawnEvent("docs/intro.md", 4)))
}

func mustEncode(t testing.TB, e Event) []byte {
	t.Helper()
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkDecodeAgrees fails if decodeCanonical accepts data and encoding/json
// decodes it differently, or not at all.
func checkDecodeAgrees(t *testing.T, data []byte) bool {
	t.Helper()
	fast, ok := decodeCanonical(data)
	if !ok {
		return false
	}
	std, err := decodeStandard(data)
	if err != nil {
		t.Fatalf("the canonical decoder accepted what encoding/json rejects (%v):\n%q", err, data)
	}
	if !reflect.DeepEqual(fast, std) {
		t.Fatalf("decoders disagree on %q:\ncanonical %#v\nstandard  %#v", data, fast, std)
	}
	return true
}

// What writers produce must take the fast path, or it is not one.
func TestDecodeCanonicalTakesWritersEvents(t *testing.T) {
	for _, data := range decodeSamples(t) {
		if !checkDecodeAgrees(t, data) {
			t.Errorf("fast path not taken for %s", data)
		}
		if _, err := DecodeEvent(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
}

// The decoded event shares no memory with its input, which the caller may
// reuse (a NATS message's buffer).
func TestDecodeCanonicalCopiesItsInput(t *testing.T) {
	for _, data := range decodeSamples(t) {
		e, ok := decodeCanonical(data)
		if !ok {
			t.Fatalf("fast path not taken for %s", data)
		}
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		for i := range data {
			data[i] = 'x'
		}
		if got, err := e.Encode(); err != nil || !bytes.Equal(got, want) {
			t.Errorf("the event changed with its input:\n got %s\nwant %s", got, want)
		}
	}
}

// Every other spelling of an event falls back to encoding/json, which
// decides as it always did.
func TestDecodeCanonicalFallsBack(t *testing.T) {
	data := string(decodeSamples(t)[0])
	for _, tc := range []struct {
		name, data string
		valid      bool // encoding/json, and then Verify, accept it
	}{
		{"whitespace", strings.Replace(data, `"kind":`, `"kind": `, 1), true},
		{"field order", strings.Replace(data[:len(data)-1], `"schema":"converge.event.v1",`, ``, 1) + `,"schema":"converge.event.v1"}`, true},
		{"escaped slash", strings.Replace(data, `docs/intro.md`, `docs\/intro.md`, 1), true},
		{"unicode escape", strings.Replace(data, `Intro"`, `Intr\u006f"`, 1), true},
		{"upper-case uuid", strings.Replace(data, data[strings.Index(data, `"id":"`)+6:][:8], strings.ToUpper(data[strings.Index(data, `"id":"`)+6:][:8]), 1), true},
		{"null links", strings.Replace(data, `"links":["docs/a.md","docs/next.md","z"]`, `"links":null`, 1), false},
		{"unknown field", strings.Replace(data, `,"content_hash"`, `,"extra":1,"content_hash"`, 1), false},
		{"trailing data", data + " {}", false},
		{"leading zero", strings.Replace(data, `"version":3`, `"version":03`, 1), false},
		{"negative zero ordinal", strings.Replace(data, `"ordinal":0`, `"ordinal":-0`, 1), true},
		{"raw control character", strings.Replace(data, `Intro"`, "Intro\x01\"", 1), false},
		{"invalid meta", strings.Replace(data, `{"lang":"en"}`, `{"lang":"en",}`, 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.data == data {
				t.Fatal("the case did not change the event")
			}
			if checkDecodeAgrees(t, []byte(tc.data)) {
				t.Fatalf("the fast path took a non-canonical event:\n%s", tc.data)
			}
			_, err := DecodeEvent([]byte(tc.data))
			if tc.valid != (err == nil) {
				t.Fatalf("DecodeEvent: err %v, want valid %v", err, tc.valid)
			}
		})
	}
}

// Every single-byte change of a canonical event: the fast path either
// declines or agrees with encoding/json.
func TestDecodeCanonicalMutations(t *testing.T) {
	for _, data := range decodeSamples(t) {
		m := make([]byte, len(data))
		for i := range data {
			for _, b := range []byte{'"', '\\', '{', '}', '[', ']', ',', ':', '0', '9', '-', 'u', 'n', ' ', 0x01, 0xff} {
				copy(m, data)
				m[i] = b
				checkDecodeAgrees(t, m)
				checkDecodeAgrees(t, append(append([]byte{}, m[:i]...), m[i+1:]...))
			}
		}
	}
}

func FuzzDecodeCanonicalMatchesStandard(f *testing.F) {
	for _, data := range decodeSamples(f) {
		f.Add(data)
	}
	f.Add([]byte(`{"schema":"","id":"00000000-0000-0000-0000-000000000000","kind":"","key":"","version":0,"title":"","links":[],"tags":[],"meta":{},"chunks":[],"content_hash":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodeAgrees(t, data)
	})
}

// BenchmarkDecodeCanonicalVsStandard decodes one ~2 KB event of four
// chunks both ways in the same run (without Verify, which both paths
// share) and prints the ratio.
func BenchmarkDecodeCanonicalVsStandard(b *testing.B) {
	body := strings.Repeat("Projectors converge a vector index and a graph; \"quoted\" text, tabs\tand newlines.\n", 24)
	d, err := Document{Key: "bench/doc", Version: 7, Title: "A benchmark document", Body: body,
		Links: []string{"bench/a", "bench/b", "bench/c"}, Tags: []string{"bench", "t1"},
		Meta: json.RawMessage(`{"source":"bench","revision":317}`)}.Normalize()
	if err != nil {
		b.Fatal(err)
	}
	q := len(d.Body) / 4
	data := mustEncode(b, NewUpsertedEvent(d, []string{d.Body[:q], d.Body[q : 2*q], d.Body[2*q : 3*q], d.Body[3*q:]}))
	var std float64 // ns per decode
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := decodeStandard(data); err != nil {
				b.Fatal(err)
			}
		}
		std = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, ok := decodeCanonical(data); !ok {
				b.Fatal("not decoded")
			}
		}
		per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		if std > 0 {
			b.Logf("%d-byte event: canonical %.1f us, encoding/json %.1f us (same run): %.2fx the time", len(data), per/1000, std/1000, per/std)
		}
	})
}
