package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The hand-written encoders must produce exactly the bytes of the reference
// implementations in reference_test.go, for any input, valid or not.

func checkEncode(t *testing.T, ev Event) {
	t.Helper()
	got, gotErr := ev.Encode()
	want, wantErr := referenceEncode(ev)
	if !sameError(gotErr, wantErr) {
		t.Fatalf("Encode error %v, reference %v\nevent %#v", gotErr, wantErr, ev)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode differs from the reference\ngot  %q\nwant %q", got, want)
	}
}

func checkDocument(t *testing.T, d Document) {
	t.Helper()
	var got bytes.Buffer
	_, _, ok := writeCanonicalDocument(&got, nil, nil, d)
	want := referenceContentHashInput(d)
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("content hash input differs from the reference\ngot  %q\nwant %q", got.Bytes(), want)
	}
	if ok != (len(want) > 0) {
		t.Fatalf("ok = %v, but the reference wrote %d bytes", ok, len(want))
	}
	if got, want := ContentHash(d), referenceContentHash(d); got != want {
		t.Fatalf("ContentHash %s, reference %s", got, want)
	}
}

func checkMeta(t *testing.T, raw []byte) {
	t.Helper()
	got, gotErr := CanonicalMeta(raw)
	want, wantErr := referenceCanonicalMeta(raw)
	if !sameError(gotErr, wantErr) {
		t.Fatalf("CanonicalMeta(%q) error %v, reference %v", raw, gotErr, wantErr)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("CanonicalMeta(%q) differs from the reference\ngot  %q\nwant %q", raw, got, want)
	}
	if gotErr != nil {
		var a, b *ValidationError
		if errors.As(gotErr, &a) != errors.As(wantErr, &b) || (a != nil && *a != *b) {
			t.Fatalf("CanonicalMeta(%q) error %#v, reference %#v", raw, gotErr, wantErr)
		}
	}
}

func checkRaw(t *testing.T, raw []byte) {
	t.Helper()
	m := json.RawMessage(raw)
	want, wantErr := referenceRawMessage(m)
	got, gotErr := appendRaw([]byte("prefix"), m)
	if gotErr == nil {
		if !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("appendRaw(%q) lost what it appended to", raw)
		}
		got = got[len("prefix"):]
	} else {
		got = nil
	}
	if !sameError(gotErr, wantErr) || !bytes.Equal(got, want) {
		t.Fatalf("appendRaw(%q) = %q, %v; reference %q, %v", raw, got, gotErr, want, wantErr)
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Error() == b.Error()
}

// trickyStrings are the strings whose encoding can go wrong.
func trickyStrings() []string {
	ss := []string{
		"", "plain", "<script>alert('&amp;')</script>", `"quoted" \back\slash\ /slash`,
		"\u2028", "\u2029", "x\u2028y\u2029z", "\u2027\u202a\u202f", "€ is E2 82 AC", "\xe2", "\xe2\x80", "a\xe2\x80\xa8\xe2",
		"\xff", "\x80", "a\x80b", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf0\x9f\x98", "\xf0\x9f\x98\x80\xff",
		"😀👍🏽 emoji", "日本語", "é", "e\u0301", "\ufffd", "\ufeffBOM", "\u0085\u00a0", "\x7f", "\x00",
	}
	var ctl, all strings.Builder
	for b := range 0x20 {
		ctl.WriteByte(byte(b))
	}
	ctl.WriteByte(0x7f)
	ss = append(ss, ctl.String())
	for b := range 256 {
		ss = append(ss, string([]byte{byte(b)}), "a"+string([]byte{byte(b)})+"b")
		all.WriteByte(byte(b))
	}
	ss = append(ss, all.String(), strings.Repeat(all.String(), 40))
	// Escapes at and around the staging buffer's boundaries.
	for _, n := range []int{stageSize - 40, stageSize - 8, stageSize - 7, stageSize - 6, stageSize - 5, stageSize - 1, stageSize, stageSize + 1, 2*stageSize - 3} {
		for _, esc := range []string{"\n", "\u2028", "\x01", "\xff", "é", "😀"} {
			ss = append(ss, strings.Repeat("x", n)+esc+strings.Repeat("y", n)+esc)
		}
	}
	ss = append(ss, strings.Repeat("a", 10*stageSize), strings.Repeat("\n", 3*stageSize), strings.Repeat("\u2028", stageSize))
	// Every byte, and the runes that stop a run, at every offset of the
	// 16-byte scan and its tail.
	for off := range 34 {
		for _, c := range []string{"\u2028", "\u2029", "é", "😀", "\xe2\x80", "\xf0\x9f\x98"} {
			ss = append(ss, strings.Repeat("a", off)+c+strings.Repeat("b", 20))
		}
		for b := range 256 {
			ss = append(ss, strings.Repeat("a", off)+string([]byte{byte(b)})+strings.Repeat("b", 20))
		}
	}
	return ss
}

// lookMask's lowest flagged byte must be exactly the first byte that is
// escaped or not ASCII: safeRun returns there.
func TestLookMaskLowestIsExact(t *testing.T) {
	look := func(b byte) bool { return b >= utf8.RuneSelf || asciiStop[b] }
	check := func(w [8]byte) {
		first := 8
		for i, b := range w {
			if look(b) {
				first = i
				break
			}
		}
		var x uint64
		for i, b := range w {
			x |= uint64(b) << (8 * i)
		}
		m := lookMask(x)
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != first {
			t.Fatalf("word % x: lowest flagged byte %d, want %d", w, got, first)
		}
	}
	for a := range 256 {
		for b := range 256 {
			for _, fill := range []byte{'a', 0x00, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0xff} {
				w := [8]byte{fill, fill, fill, fill, fill, fill, fill, fill}
				w[3], w[4] = byte(a), byte(b)
				check(w)
				w[0], w[7] = byte(a), byte(b)
				check(w)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		var w [8]byte
		for i := range w {
			w[i] = byte(rng.IntN(256))
			if rng.IntN(4) != 0 {
				w[i] = byte(0x20 + rng.IntN(0x60)) // mostly printable ASCII
			}
		}
		check(w)
	}
}

func TestEncodeMatchesReference(t *testing.T) {
	id := uuid.MustParse("01234567-89ab-cdef-fedc-ba9876543210")
	for i, s := range trickyStrings() {
		ev := Event{
			Schema: s, ID: id, Kind: Kind(s), Key: s, Version: int64(i), Title: s,
			Links: []string{s, s + "x", ""}, Tags: []string{s}, Meta: json.RawMessage(`{}`),
			Chunks:      []EventChunk{{ID: id, Ordinal: i, Text: s, Hash: s}, {Text: "<&>" + s}},
			ContentHash: s,
		}
		checkEncode(t, ev)
	}
	base := NewWithdrawnEvent("docs/intro.md", 4)
	big := strings.Repeat("Hello <world> & \"friends\"\n\t\x01\u2028 — 日本語 😀\xff ", 40000)
	for name, mutate := range map[string]func(*Event){
		"zero":               func(e *Event) { *e = Event{} },
		"nil links":          func(e *Event) { e.Links = nil },
		"nil tags":           func(e *Event) { e.Tags = nil },
		"nil chunks":         func(e *Event) { e.Chunks = nil },
		"empty chunks":       func(e *Event) { e.Chunks = []EventChunk{} },
		"empty chunk":        func(e *Event) { e.Chunks = []EventChunk{{}} },
		"nil meta":           func(e *Event) { e.Meta = nil },
		"empty meta":         func(e *Event) { e.Meta = json.RawMessage{} },
		"meta with space":    func(e *Event) { e.Meta = json.RawMessage(" { \"a\" : [ 1 , \"b c\" ] ,\n\t\"d\":{} } \n") },
		"meta html":          func(e *Event) { e.Meta = json.RawMessage(`{"a":"<&>\u2028","b":"` + "<&>\u2028\u2029" + `"}`) },
		"meta unsorted":      func(e *Event) { e.Meta = json.RawMessage(`{"b":1,"a":1,"a":2}`) },
		"meta null":          func(e *Event) { e.Meta = json.RawMessage(`null`) },
		"meta array":         func(e *Event) { e.Meta = json.RawMessage(` [1,2 ] `) },
		"meta string":        func(e *Event) { e.Meta = json.RawMessage(`"s"`) },
		"meta invalid":       func(e *Event) { e.Meta = json.RawMessage(`{"a":`) },
		"meta trailing":      func(e *Event) { e.Meta = json.RawMessage(`{} {}`) },
		"meta space only":    func(e *Event) { e.Meta = json.RawMessage(`   `) },
		"meta bad utf8":      func(e *Event) { e.Meta = json.RawMessage("{\"a\":\"\xff\"}") },
		"min version":        func(e *Event) { e.Version = math.MinInt64 },
		"max version":        func(e *Event) { e.Version = math.MaxInt64 },
		"negative ordinal":   func(e *Event) { e.Chunks = []EventChunk{{Ordinal: -1}, {Ordinal: math.MaxInt}, {Ordinal: math.MinInt}} },
		"large body":         func(e *Event) { e.Chunks = []EventChunk{{Text: big}, {Text: big[:len(big)/3]}} },
		"empty link and tag": func(e *Event) { e.Links, e.Tags = []string{""}, []string{"", ""} },
	} {
		t.Run(name, func(t *testing.T) {
			ev := base // mutations replace fields, never write into base's slices
			mutate(&ev)
			checkEncode(t, ev)
		})
	}
	d, err := Document{Key: "docs/intro.md", Version: 3, Title: "Intro <&>", Body: strings.ReplaceAll(big, "\xff", "?"),
		Links: []string{"b", "a"}, Tags: []string{"t"}, Meta: json.RawMessage(`{"z":1,"a":"\u2028"}`)}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("upserted", func(t *testing.T) { checkEncode(t, NewUpsertedEvent(d, []string{d.Body[:1000], d.Body[1000:]})) })
	t.Run("withdrawn", func(t *testing.T) { checkEncode(t, base) })
}

func TestContentHashMatchesReference(t *testing.T) {
	for i, s := range trickyStrings() {
		d := Document{Key: s, Version: int64(i), Title: s, Body: s + s, Links: []string{s, ""}, Tags: []string{s}, Meta: json.RawMessage(`{"a":1}`)}
		checkDocument(t, d)
	}
	big := strings.Repeat("Hello <world> & \"friends\"\n\t\x01\u2028 — 日本語 😀\xff ", 40000)
	for name, d := range map[string]Document{
		"zero":            {},
		"nil slices":      {Key: "k", Links: nil, Tags: nil},
		"empty slices":    {Key: "k", Links: []string{}, Tags: []string{}},
		"empty meta":      {Key: "k", Meta: json.RawMessage{}},
		"meta with space": {Key: "k", Meta: json.RawMessage(" {\"a\" : [1, 2]}\n")},
		"meta raw 2028":   {Key: "k", Meta: json.RawMessage("{\"a\":\"<&>\u2028\"}")},
		"meta null":       {Key: "k", Meta: json.RawMessage(`null`)},
		"meta invalid":    {Key: "k", Body: "body", Meta: json.RawMessage(`{"a":`)},
		"meta blank":      {Key: "k", Meta: json.RawMessage(`  `)},
		"large body":      {Key: "k", Title: "t", Body: big, Links: []string{"a", "b"}, Tags: []string{"x"}},
		"large meta":      {Key: "k", Meta: json.RawMessage(`{"a":"` + strings.Repeat("m", 5*stageSize) + `"}`)},
	} {
		t.Run(name, func(t *testing.T) { checkDocument(t, d) })
	}
}

// metaInputs are meta values whose canonical form or refusal can go wrong.
func metaInputs() []string {
	ms := []string{
		``, `   `, `null`, ` null `, `{}`, ` { } `, "\t{\r\n}\n", `{"a":1}`, `{"b":1,"a":2}`,
		`{"a":1,"a":2}`, `{"a":1,"b":2,"a":3}`, `{"b":1,"a":2,"b":3,"a":4,"c":5}`, `{"a":1,"\u0061":2}`, `{"a":{"y":1,"x":2},"a":{"w":3}}`, `{"b":{"d":1,"c":2,"d":3},"a":[{"f":1,"e":2,"f":{"h":1,"g":2}}]}`, `{"\u0062":1,"a":2}`,
		`{"z":{"y":1,"x":[{"b":1,"a":2},{"d":[],"c":{}}]},"a":null}`,
		`{"n":[-0,0,1E+2,1e-2,1.50,0.0e-0,-12.5E7,123456789012345678901234567890,1e999]}`,
		`{"s":"\u003c\u003e\u0026\/\b\f\n\r\t\u0001\u001f\u007f\u0080\u2028\u2029\ud83d\ude00\uD83D\uDE00"}`,
		`{"s":"\ud800"}`, `{"s":"\ud800x"}`, `{"s":"\udc00\ud800"}`, `{"s":"\ud800\ud800\udc00"}`, `{"s":"\ud800\u0041"}`,
		`{"s":"\ud800\n"}`, `{"s":"\ud800\"}`, `{"s":"\ud800\u12"}`, `{"s":"\uFFFD\ufffe"}`,
		"{\"s\":\"raw \u2028 \u2029 <&> é 😀\"}", "{\"\u2028\":\"k\"}",
		`{"k\u0000":1}`, `{"a":"\u0000"}`, `{"a":"\u0000","a":1}`, `{"a":["\u0000"]}`, `{"a":"x\u0000y"}`,
		`{}}`, `{}]`, `{} {}`, `{},`, `{}x`, `{} }`, `{}} x`, `{"a":1}]]`,
		`[1]`, `[]`, `"s"`, `1`, `true`, `false`, `{`, `}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{'a':1}`, `{a:1}`,
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":+1}`, `{"a":1e}`, `{"a":1e+}`, `{"a":-01}`, `{"a":0x1}`,
		`{"a":tru}`, `{"a":truex}`, `{"a":nul}`, `{"a":NaN}`, `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\u12g4"}`, `{"a":"\'"}`,
		"{\"a\":\"tab\there\"}", "{\"a\":\"nl\nhere\"}", `{"a":1,}`, `{,"a":1}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"a":[1 2]}`,
		"\u00a0{}\u00a0", "\u0085{\"a\":1}\u2028", "\ufeff{}", "{\"a\":1}\u3000",
		`{"":1,"":2}`, `{"é":1,"e":2,"z":3,"É":4,"\u00e9":5,"\u00c9":6,"Z":7,"~":8,"\u007f":9,"😀":10,"\ufffd":11}`,
		"{\"a\":\"\xff\"}", "{\"\xc3\":1}",
		" [ 1 , { \"b\" : \"c d\" , \"a\" : [ ] } ] ", ` "a b" `, `1 2`, ` -0.5e+3 `, `"\u2028\"\\"`, "\"\u2028\xff<&>\"",
		"\"\x00\"", `[1,2]]`, `[`, `]`, `"`, `"\`, `"\u`, `{"a":"b"`, `{"a":"b",`, `{"a"`, `{"a":[1}`, `[{]`, `tru`, `nul`, `-`,
		"{\t\"a\"\r\n:\n1\n, \"b\" :[ ] ,\"c\":{ },\"d\":[ 1 , 2 ] }",
		`{"source": {"repo": "converge", "path": "docs/guides/getting-started.md"}, "lang": "en", "rev": 12, "authors": ["ana", "bo"], "draft": false}`,
		`{"a":` + strings.Repeat("x", MaxMetaBytes) + `}`,
		`{"a":"` + strings.Repeat("x", MaxMetaBytes-8) + `"}`,
		`{"a":"` + strings.Repeat("\u2028", (MaxMetaBytes-8)/3) + `"}`,
	}
	for _, n := range []int{maxFastDepth - 2, maxFastDepth - 1, maxFastDepth, maxFastDepth + 1, 100, 9998, 9999, 10000, 10001} {
		ms = append(ms, `{"a":`+strings.Repeat("[", n)+strings.Repeat("]", n)+`}`)
		ms = append(ms, strings.Repeat(`{"b":1,"a":`, n)+"{}"+strings.Repeat("}", n))
	}
	return ms
}

func TestCanonicalMetaMatchesReference(t *testing.T) {
	for i, m := range metaInputs() {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkMeta(t, []byte(m))
			checkRaw(t, []byte(m))
		})
	}
	checkMeta(t, nil)
	checkRaw(t, nil)
	checkRaw(t, []byte{})
}

// The fast path must handle what writers send, not leave it to the
// decoding path.
func TestCanonicalMetaFastPathTaken(t *testing.T) {
	for _, m := range []string{
		`{}`, `{"lang":"en"}`, `{ "z": "é", "a": [1, 2.5] }`, `{"b":{"d":1,"c":[true,false,null]},"a":"\u2028\n"}`,
		`{"a":1,"a":2}`, `{"s":"\ud800"}`,
	} {
		if _, ok := canonicalMetaFast([]byte(m)); !ok {
			t.Errorf("%s: fast path not taken", m)
		}
	}
}

func FuzzCanonicalEncodingMatchesReference(f *testing.F) {
	f.Add("docs/intro.md", "Intro", "# Intro\n\nHello <world> & friends\n", "docs/next.md", []byte(`{"lang":"en"}`), uint8(0), int64(3))
	f.Add("k", "\u2028\x01\"\\", "a\xffb\xe2\x80\xa9c\x1f", "", []byte(` { "b" : 1, "a":[1,2] } `), uint8(0x1f), int64(-1))
	f.Add("", "", "", "", []byte{}, uint8(0x08), int64(0))
	f.Fuzz(func(t *testing.T, key, title, body, link string, meta []byte, flags uint8, version int64) {
		m := json.RawMessage(append([]byte{}, meta...)) // never nil
		if flags&0x08 != 0 {
			m = nil
		}
		// Split the body anywhere, even inside a rune, as a decoded event
		// may carry any chunk texts.
		cut1, cut2 := int(flags)%(len(body)+1), int(uint64(version)%uint64(len(body)+1))
		cut1, cut2 = min(cut1, cut2), max(cut1, cut2)
		ev := Event{
			Schema: SchemaV1, ID: EventID(key, version, KindUpserted), Kind: Kind(link), Key: key, Version: version,
			Title: title, Links: []string{link, title}, Tags: []string{key}, Meta: m,
			Chunks: []EventChunk{
				{ID: ChunkID(key, version, 0), Ordinal: 0, Text: body[:cut1], Hash: TextHash(body[:cut1])},
				{ID: ChunkID(key, version, 1), Ordinal: int(version), Text: body[cut1:cut2], Hash: link},
				{Ordinal: 2, Text: body[cut2:], Hash: title},
			},
			ContentHash: body[:min(64, len(body))],
		}
		if flags&0x01 != 0 {
			ev.Links = nil
		}
		if flags&0x02 != 0 {
			ev.Tags = nil
		}
		if flags&0x04 != 0 {
			ev.Chunks = nil
		}
		if flags&0x10 != 0 {
			ev.Links, ev.Tags, ev.Chunks = []string{}, []string{}, []EventChunk{}
		}
		checkEncode(t, ev)
		d := Document{Key: key, Version: version, Title: title, Body: body, Links: ev.Links, Tags: ev.Tags, Meta: m}
		checkDocument(t, d)
		checkMeta(t, meta)
		if norm, err := d.Normalize(); err == nil {
			checkDocument(t, norm)
			up := NewUpsertedEvent(norm, []string{norm.Body[:cut1], norm.Body[cut1:]})
			checkEncode(t, up)
			data, err := up.Encode()
			if err != nil {
				t.Fatal(err)
			}
			// Split on a rune boundary into non-empty chunks, the event of a
			// normalised document verifies.
			c0, c1 := norm.Body[:cut1], norm.Body[cut1:]
			if _, err := DecodeEvent(data); err != nil && c0 != "" && c1 != "" && utf8.ValidString(c0) && utf8.ValidString(c1) {
				t.Fatalf("event of a normalised document does not decode: %v\n%s", err, data)
			}
		}
		if version > 0 {
			checkEncode(t, NewWithdrawnEvent(key, version))
		}
	})
}

func FuzzCanonicalMetaMatchesReference(f *testing.F) {
	for _, m := range metaInputs() {
		if len(m) < 1024 {
			f.Add([]byte(m))
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkMeta(t, raw)
		checkRaw(t, raw)
		// Where CanonicalMeta reaches the fast path, what it accepts is
		// exactly what the reference produces.
		trimmed := bytes.TrimSpace(raw)
		if len(trimmed) == 0 || len(trimmed) > MaxMetaBytes || !utf8.Valid(trimmed) {
			return
		}
		if fast, ok := canonicalMetaFast(trimmed); ok {
			want, err := referenceCanonicalMeta(raw)
			if err != nil || !bytes.Equal(fast, want) {
				t.Fatalf("fast path accepted %q as %q; reference %q, %v", raw, fast, want, err)
			}
		}
	})
}
