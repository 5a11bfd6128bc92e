package embedded

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal"
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
	add(encodeDimension(2))
	add(encodeUpsert([]*index.Point{&p, &q}))
	add(encodeKeeps(opDeleteStale, []index.Keep{{Key: "k", Version: 3}, {Key: "j"}}))
	add(encodeKeeps(opDeleteOlder, []index.Keep{{Key: "k", Version: 3}, {Key: "j"}}))
	add(encodeKeeps(opRetract, []index.Keep{{Key: "k", Version: 3}}))
	add(encodeMarkers([]index.Marker{{Key: "k", Version: 3, ContentHash: "h"}, {Key: "j", Version: 9, Deleted: true}}))
	return recs
}

// FuzzDecodeRecord checks that no payload makes the decoder panic or
// allocate beyond its size, and that what decodes re-encodes to the same
// content.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range seedRecords(f) {
		f.Add(rec[wal.HeaderSize:])
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
			rec2, err := decodeRecord(again[wal.HeaderSize:])
			if err != nil {
				t.Fatalf("re-encoded upsert does not decode: %v", err)
			}
			if len(rec2.points) != len(rec.points) {
				t.Fatalf("%d points, then %d", len(rec.points), len(rec2.points))
			}
		}
	})
}

// FuzzOpen opens a directory whose log ends in arbitrary bytes: Open either
// fails with an error or yields a usable store.
func FuzzOpen(f *testing.F) {
	recs := seedRecords(f)
	f.Add(recs[1])
	f.Add(recs[1][:30])
	f.Add(append(recs[3], 0, 0, 0))
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
		lf, err := os.OpenFile(filepath.Join(dir, wal.LogName(1)), os.O_WRONLY|os.O_APPEND, 0)
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

// A dimension record outside 1..MaxDimension is corrupt, whatever its
// checksum says: the store must not open with it.
func TestDecodeRecordRejectsBadDimensions(t *testing.T) {
	for _, dim := range []uint64{0, MaxDimension + 1, 1 << 62} {
		payload := binary.AppendUvarint([]byte{opDimension}, dim)
		if _, err := decodeRecord(payload); err == nil {
			t.Errorf("dimension %d decoded", dim)
		}
	}
	rec, err := decodeRecord(binary.AppendUvarint([]byte{opDimension}, 384))
	if err != nil || rec.dim != 384 {
		t.Errorf("dimension 384: %+v %v", rec, err)
	}
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ensure(context.Background(), MaxDimension+1); err == nil {
		t.Error("Ensure took a dimension above MaxDimension")
	}
}
