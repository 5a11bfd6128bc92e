package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// A record on disk is a 12-byte header and a payload:
//
//	length   uint32 LE  payload length
//	lencheck uint32 LE  CRC-32C of the 4 length bytes
//	checksum uint32 LE  CRC-32C of the payload
//
// The length has its own checksum so that a damaged length is told apart
// from a record cut short by a crash: without it, a flipped bit in a length
// in the middle of a log would look like a torn tail and the reader would
// drop every later record.
const (
	// HeaderSize is the number of bytes before each record's payload.
	HeaderSize = 12
	// MaxRecordSize is the largest payload a record may hold.
	MaxRecordSize = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewRecord returns a buffer with room for a record header, to which the
// payload is appended before [Seal].
func NewRecord(capacity int) []byte {
	return make([]byte, HeaderSize, HeaderSize+capacity)
}

// Seal fills in the header of a buffer made by [NewRecord] and returns it.
func Seal(rec []byte) ([]byte, error) {
	n := len(rec) - HeaderSize
	if n <= 0 || n > MaxRecordSize {
		return nil, fmt.Errorf("wal: record of %d bytes (at most %d)", n, MaxRecordSize)
	}
	binary.LittleEndian.PutUint32(rec[0:4], uint32(n))
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[0:4], castagnoli))
	binary.LittleEndian.PutUint32(rec[8:12], crc32.Checksum(rec[HeaderSize:], castagnoli))
	return rec, nil
}

// Reader reads the records of one file in order.
type Reader struct {
	path string
	r    *bufio.Reader
	size int64 // the file's size when opened
	off  int64 // offset of the next record
	buf  []byte
}

// NewReader reads the records of f, which is named path in errors, from its
// current position (the start of the file).
func NewReader(f *os.File, path string) (*Reader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("wal: stat %s: %w", path, err)
	}
	return &Reader{path: path, r: bufio.NewReaderSize(f, 1<<20), size: fi.Size()}, nil
}

// Offset is the offset of the next record: after [ErrTorn], that of the
// torn record, where the file should be truncated.
func (rr *Reader) Offset() int64 { return rr.off }

// Size is the file's size when the Reader was made.
func (rr *Reader) Size() int64 { return rr.size }

// Corrupt returns a [*CorruptError] for the record at [Reader.Offset].
func (rr *Reader) Corrupt(reason string) error {
	return &CorruptError{Path: rr.path, Offset: rr.off, Reason: reason}
}

// Next returns the next record's payload, valid until the following call.
// At the clean end of the file it returns io.EOF; for a final record that
// is incomplete, [ErrTorn]; for a damaged record that is not the last thing
// in the file, a [*CorruptError].
func (rr *Reader) Next() ([]byte, error) {
	rem := rr.size - rr.off
	if rem == 0 {
		return nil, io.EOF
	}
	if rem < HeaderSize {
		return nil, ErrTorn
	}
	var h [HeaderSize]byte
	if _, err := io.ReadFull(rr.r, h[:]); err != nil {
		return nil, fmt.Errorf("wal: read %s at offset %d: %w", rr.path, rr.off, err)
	}
	n := int64(binary.LittleEndian.Uint32(h[0:4]))
	if crc32.Checksum(h[0:4], castagnoli) != binary.LittleEndian.Uint32(h[4:8]) {
		// A file extended by a crash before its data reached the disk reads
		// back as zeros; anything else is damage.
		zero, err := rr.restIsZero(h[:])
		if err != nil {
			return nil, err
		}
		if zero {
			return nil, ErrTorn
		}
		return nil, rr.Corrupt("length checksum mismatch")
	}
	if n == 0 || n > MaxRecordSize {
		return nil, rr.Corrupt(fmt.Sprintf("implausible record length %d", n))
	}
	if HeaderSize+n > rem {
		return nil, ErrTorn
	}
	if int64(cap(rr.buf)) < n {
		rr.buf = make([]byte, n)
	}
	payload := rr.buf[:n]
	if _, err := io.ReadFull(rr.r, payload); err != nil {
		return nil, fmt.Errorf("wal: read %s at offset %d: %w", rr.path, rr.off, err)
	}
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(h[8:12]) {
		if HeaderSize+n == rem {
			// The last record, complete in length but not in content: its
			// pages did not all reach the disk.
			return nil, ErrTorn
		}
		return nil, rr.Corrupt("payload checksum mismatch")
	}
	rr.off += HeaderSize + n
	return payload, nil
}

// restIsZero reports whether the header already read and the rest of the
// file are all zero bytes.
func (rr *Reader) restIsZero(read []byte) (bool, error) {
	for _, b := range read {
		if b != 0 {
			return false, nil
		}
	}
	for {
		b, err := rr.r.ReadByte()
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("wal: read %s: %w", rr.path, err)
		}
		if b != 0 {
			return false, nil
		}
	}
}
