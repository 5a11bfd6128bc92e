package embedded

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-sync/converge/internal/index"
)

func seedRecords(f *testing.F) [][]byte {
	f.Helper()
	var recs [][]byte
	add := func(rec []byte, err error) {
		if err != nil {
			f.Fatal(err)
		}
		recs = append(recs, rec)
	}
	p := mkPoint("k", 3, 1, []float32{0.6, 0.8})
	q := mkPoint("k", 3, 2, []float32{1, 0})
	q.Tags = nil
	add(encodeLogHeader(7))
	add(encodeDimension(2))
	add(encodeUpsert([]*index.Point{&p, &q}))
	add(encodeDeleteStale([]index.Keep{{Key: "k", Version: 3}, {Key: "j"}}))
	add(encodeMarkers([]index.Marker{{Key: "k", Version: 3, ContentHash: "h"}, {Key: "j", Version: 9, Deleted: true}}))
	add(encodeSnapshotHeader(4, 2, 10, 20))
	add(encodeSnapshotEnd(10, 20))
	return recs
}

// FuzzDecodeRecord checks that no payload makes the decoder panic or
// allocate beyond its size, and that what decodes re-encodes to the same
// content.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range seedRecords(f) {
		f.Add(rec[recordHeaderSize:])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		rec, err := decodeRecord(payload)
		if err != nil {
			return
		}
		if rec.op == opUpsert {
			again, err := encodeUpsert(rec.points)
			if err != nil {
				t.Fatal(err)
			}
			rec2, err := decodeRecord(again[recordHeaderSize:])
			if err != nil {
				t.Fatalf("re-encoded upsert does not decode: %v", err)
			}
			if len(rec2.points) != len(rec.points) {
				t.Fatalf("%d points, then %d", len(rec.points), len(rec2.points))
			}
		}
	})
}

// FuzzRecordReader feeds arbitrary bytes after valid records: the reader
// must return the valid records, then a clean end, a torn tail or a
// corruption error, and never a payload that fails its checksum.
func FuzzRecordReader(f *testing.F) {
	recs := seedRecords(f)
	f.Add([]byte{}, 2)
	f.Add(recs[2][:20], 1)
	f.Add(make([]byte, 64), 3)
	f.Add(bytes.Join(recs, nil), 0)
	f.Fuzz(func(t *testing.T, tail []byte, valid int) {
		valid = max(0, valid) % (len(recs) + 1)
		path := filepath.Join(t.TempDir(), "log")
		content := append(bytes.Join(recs[:valid], nil), tail...)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		rr, err := newRecordReader(file, path)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			payload, err := rr.next()
			if i < valid && (err != nil || !bytes.Equal(payload, recs[i][recordHeaderSize:])) {
				t.Fatalf("record %d: %v", i, err)
			}
			var ce *CorruptError
			switch {
			case err == nil:
				if _, derr := decodeRecord(payload); derr != nil && i < valid {
					t.Fatalf("valid record %d does not decode: %v", i, derr)
				}
				if rr.off > rr.size {
					t.Fatalf("offset %d beyond size %d", rr.off, rr.size)
				}
				continue
			case errors.Is(err, io.EOF), errors.Is(err, errTorn):
			case errors.As(err, &ce):
				if ce.Offset < 0 || ce.Offset >= rr.size {
					t.Fatalf("corruption at offset %d of %d", ce.Offset, rr.size)
				}
			default:
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
	})
}

// FuzzOpen opens a directory whose log ends in arbitrary bytes: Open either
// fails with an error or yields a usable store.
func FuzzOpen(f *testing.F) {
	recs := seedRecords(f)
	f.Add(recs[2])
	f.Add(recs[2][:30])
	f.Add(append(recs[4], 0, 0, 0))
	f.Fuzz(func(t *testing.T, tail []byte) {
		dir := t.TempDir()
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Ensure(context.Background(), 2); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		lf, err := os.OpenFile(filepath.Join(dir, logName(1)), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = lf.Write(tail)
		_ = lf.Close()
		s, err = Open(dir, Options{})
		if err != nil {
			return
		}
		defer s.Close()
		if _, err := s.Search(context.Background(), []float32{1, 0}, 3); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMarkers(context.Background(), []index.Marker{{Key: "x", Version: 1}}); err != nil {
			t.Fatal(err)
		}
	})
}
