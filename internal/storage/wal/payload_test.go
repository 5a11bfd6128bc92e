package wal

import (
	"encoding/binary"
	"strings"
	"testing"
)

func TestDecoderRoundTrip(t *testing.T) {
	b := []byte{9}
	b = AppendString(b, "key")
	b = binary.AppendVarint(b, -42)
	b = binary.AppendUvarint(b, 1<<40)
	b = AppendBool(b, true)
	b = AppendBool(b, false)
	b = AppendString(b, "")
	b = append(b, 1, 2, 3)
	d := NewDecoder(b)
	if op, s, v, u, t1, f1, e, fixed := d.Byte(), d.Str(), d.Varint(), d.Uvarint(), d.Bool(), d.Bool(), d.Str(), d.Fixed(3); op != 9 || s != "key" || v != -42 || u != 1<<40 || !t1 || f1 || e != "" || string(fixed) != "\x01\x02\x03" {
		t.Fatalf("decoded %d %q %d %d %v %v %q %v", op, s, v, u, t1, f1, e, fixed)
	}
	if err := d.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestDecoderFailures(t *testing.T) {
	cases := []struct {
		name    string
		payload []byte
		read    func(d *Decoder)
		want    string
	}{
		{"empty", nil, func(d *Decoder) { d.Byte() }, "ends early"},
		{"cut varint", []byte{0x80}, func(d *Decoder) { d.Uvarint() }, "ends early"},
		{"cut string", AppendString(nil, "abc")[:2], func(d *Decoder) { d.Str() }, "exceeds the payload"},
		{"count beyond the payload", binary.AppendUvarint(nil, 5), func(d *Decoder) { d.Count(1) }, "exceeds the payload"},
		{"count of large items", append(binary.AppendUvarint(nil, 2), make([]byte, 15)...), func(d *Decoder) { d.Count(8) }, "exceeds the payload"},
		{"bad flag", []byte{2}, func(d *Decoder) { d.Bool() }, "bad flag"},
		{"short fixed", []byte{1, 2}, func(d *Decoder) { d.Fixed(3) }, "ends early"},
		{"trailing", []byte{1, 2}, func(d *Decoder) { d.Byte() }, "1 trailing bytes"},
		{"first failure sticks", []byte{2, 1}, func(d *Decoder) { d.Bool(); d.Str() }, "bad flag"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(tc.payload)
			tc.read(d)
			if err := d.Finish(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Finish: %v, want %q", err, tc.want)
			}
			if d.Byte() != 0 || d.Str() != "" || d.Remaining() != 0 {
				t.Fatal("reads after a failure return values")
			}
		})
	}
}

// SealListInto builds the same record as SealList, in the buffer it is
// given when that has the room, and in a new one when it does not.
func TestSealListInto(t *testing.T) {
	items := []string{"a", "bc", strings.Repeat("d", 300)}
	size := func(s string) int { return binary.MaxVarintLen64 + len(s) }
	want, err := SealList(7, items, size, AppendString)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 0, 4096)
	got, err := SealListInto(big, 7, items, size, AppendString)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("record in a reused buffer differs:\n%q\n%q", got, want)
	}
	if &got[:1][0] != &big[:1][0] {
		t.Fatal("a buffer with room was not reused")
	}
	small := make([]byte, 0, 8)
	got, err = SealListInto(small, 7, items, size, AppendString)
	if err != nil || string(got) != string(want) {
		t.Fatalf("record from a small buffer: %q, %v", got, err)
	}
	if &got[:1][0] == &small[:1][0] {
		t.Fatal("a buffer without room was written past its capacity")
	}
}
