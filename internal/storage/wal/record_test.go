package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sealed(t testing.TB, payload string) []byte {
	t.Helper()
	rec, err := Seal(append(NewRecord(len(payload)), payload...))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// readAll reads the records of content, returning the payloads and the
// error that ended the reading (io.EOF at a clean end).
func readAll(t testing.TB, content []byte) (payloads []string, r *Reader, end error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "records")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err = NewReader(f, path)
	if err != nil {
		t.Fatal(err)
	}
	for {
		p, err := r.Next()
		if err != nil {
			return payloads, r, err
		}
		payloads = append(payloads, string(p))
	}
}

func TestSealRejectsEmptyPayload(t *testing.T) {
	if _, err := Seal(NewRecord(0)); err == nil {
		t.Fatal("an empty record was sealed")
	}
}

func TestReaderEnds(t *testing.T) {
	a, b := sealed(t, "first record"), sealed(t, strings.Repeat("second ", 40))
	both := append(append([]byte{}, a...), b...)
	bStart := int64(len(a))
	damaged := func(off int64, mask byte) []byte {
		c := bytes.Clone(both)
		c[off] ^= mask
		return c
	}
	cases := []struct {
		name    string
		content []byte
		records int
		end     error  // io.EOF, ErrTorn, or ErrCorrupt
		reason  string // of the corruption
	}{
		{"clean", both, 2, io.EOF, ""},
		{"empty file", nil, 0, io.EOF, ""},
		{"partial header", both[:bStart+5], 1, ErrTorn, ""},
		{"header only", both[:bStart+HeaderSize], 1, ErrTorn, ""},
		{"partial payload", both[:len(both)-1], 1, ErrTorn, ""},
		{"last payload damaged", damaged(int64(len(both)-2), 0x01), 1, ErrTorn, ""},
		{"zeros after the records", append(bytes.Clone(both), make([]byte, 100)...), 2, ErrTorn, ""},
		{"length damaged", damaged(1, 0x40), 0, ErrCorrupt, "length checksum"},
		{"payload damaged before the last", damaged(HeaderSize+2, 0x08), 0, ErrCorrupt, "payload checksum"},
		{"zeroed first record", append(make([]byte, len(a)), b...), 0, ErrCorrupt, "length checksum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, r, end := readAll(t, tc.content)
			if len(got) != tc.records {
				t.Fatalf("%d records, want %d", len(got), tc.records)
			}
			if !errors.Is(end, tc.end) {
				t.Fatalf("ended with %v, want %v", end, tc.end)
			}
			if want := []int64{0, bStart, int64(len(both))}[tc.records]; errors.Is(tc.end, ErrTorn) && r.Offset() != want {
				t.Fatalf("torn at offset %d, want %d", r.Offset(), want)
			}
			var ce *CorruptError
			if errors.As(end, &ce) {
				if ce.Offset != 0 || !strings.Contains(ce.Reason, tc.reason) || !strings.Contains(end.Error(), ce.Path) {
					t.Fatalf("corruption %v, want offset 0 and %q", end, tc.reason)
				}
			}
		})
	}
}

func TestImplausibleLength(t *testing.T) {
	// A length beyond MaxRecordSize whose own checksum holds.
	h := make([]byte, HeaderSize)
	binary.LittleEndian.PutUint32(h[0:4], MaxRecordSize+1)
	binary.LittleEndian.PutUint32(h[4:8], crc32.Checksum(h[0:4], castagnoli))
	_, _, end := readAll(t, append(h, sealed(t, "after")...))
	if !errors.Is(end, ErrCorrupt) || !strings.Contains(end.Error(), "implausible record length") {
		t.Fatalf("got %v, want an implausible length", end)
	}
}

// FuzzRecordReader feeds arbitrary bytes after valid records: the reader
// must return the valid records, then a clean end, a torn tail or a
// corruption error, and never a payload that fails its checksum.
func FuzzRecordReader(f *testing.F) {
	var recs [][]byte
	for i := range 4 {
		recs = append(recs, sealed(f, fmt.Sprintf("record %d %s", i, strings.Repeat("x", i*50))))
	}
	f.Add([]byte{}, 2)
	f.Add(recs[2][:20], 1)
	f.Add(make([]byte, 64), 3)
	f.Add(bytes.Join(recs, nil), 0)
	f.Fuzz(func(t *testing.T, tail []byte, valid int) {
		valid = max(0, valid) % (len(recs) + 1)
		content := append(bytes.Join(recs[:valid], nil), tail...)
		got, r, end := readAll(t, content)
		if len(got) < valid {
			t.Fatalf("%d records read, %d valid ones written: %v", len(got), valid, end)
		}
		for i := range valid {
			if got[i] != string(recs[i][HeaderSize:]) {
				t.Fatalf("record %d differs", i)
			}
		}
		if r.Offset() > r.Size() {
			t.Fatalf("offset %d beyond size %d", r.Offset(), r.Size())
		}
		var ce *CorruptError
		switch {
		case errors.Is(end, io.EOF), errors.Is(end, ErrTorn):
		case errors.As(end, &ce):
			if ce.Offset < 0 || ce.Offset >= r.Size() {
				t.Fatalf("corruption at offset %d of %d", ce.Offset, r.Size())
			}
		default:
			t.Fatalf("unexpected error %v", end)
		}
	})
}
