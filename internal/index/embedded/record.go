package embedded

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
	recordHeaderSize = 12
	maxRecordSize    = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// newRecordBuf returns a buffer with room for a record header, to which the
// payload is appended before [sealRecord].
func newRecordBuf(capacity int) []byte {
	return make([]byte, recordHeaderSize, recordHeaderSize+capacity)
}

// sealRecord fills in the header of a buffer made by [newRecordBuf].
func sealRecord(rec []byte) ([]byte, error) {
	n := len(rec) - recordHeaderSize
	if n <= 0 || n > maxRecordSize {
		return nil, fmt.Errorf("embedded index: record of %d bytes (at most %d)", n, maxRecordSize)
	}
	binary.LittleEndian.PutUint32(rec[0:4], uint32(n))
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[0:4], castagnoli))
	binary.LittleEndian.PutUint32(rec[8:12], crc32.Checksum(rec[recordHeaderSize:], castagnoli))
	return rec, nil
}

// errTorn reports a final record that a crash cut short: the file should be
// truncated at the record's offset.
var errTorn = errors.New("embedded index: torn record")

// recordReader reads the records of one file in order.
type recordReader struct {
	path string
	r    *bufio.Reader
	size int64 // the file's size when opened
	off  int64 // offset of the next record
	buf  []byte
}

func newRecordReader(f *os.File, path string) (*recordReader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("embedded index: stat %s: %w", path, err)
	}
	return &recordReader{path: path, r: bufio.NewReaderSize(f, 1<<20), size: fi.Size()}, nil
}

func (rr *recordReader) corrupt(reason string) error {
	return &CorruptError{Path: rr.path, Offset: rr.off, Reason: reason}
}

// next returns the next record's payload, valid until the following call.
// At the clean end of the file it returns io.EOF; for a final record that is
// incomplete, errTorn (rr.off is then the record's offset); for a damaged
// record that is not the last thing in the file, a *CorruptError.
func (rr *recordReader) next() ([]byte, error) {
	rem := rr.size - rr.off
	if rem == 0 {
		return nil, io.EOF
	}
	if rem < recordHeaderSize {
		return nil, errTorn
	}
	var h [recordHeaderSize]byte
	if _, err := io.ReadFull(rr.r, h[:]); err != nil {
		return nil, fmt.Errorf("embedded index: read %s at offset %d: %w", rr.path, rr.off, err)
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
			return nil, errTorn
		}
		return nil, rr.corrupt("length checksum mismatch")
	}
	if n == 0 || n > maxRecordSize {
		return nil, rr.corrupt(fmt.Sprintf("implausible record length %d", n))
	}
	if recordHeaderSize+n > rem {
		return nil, errTorn
	}
	if int64(cap(rr.buf)) < n {
		rr.buf = make([]byte, n)
	}
	payload := rr.buf[:n]
	if _, err := io.ReadFull(rr.r, payload); err != nil {
		return nil, fmt.Errorf("embedded index: read %s at offset %d: %w", rr.path, rr.off, err)
	}
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(h[8:12]) {
		if recordHeaderSize+n == rem {
			// The last record, complete in length but not in content: its
			// pages did not all reach the disk.
			return nil, errTorn
		}
		return nil, rr.corrupt("payload checksum mismatch")
	}
	rr.off += recordHeaderSize + n
	return payload, nil
}

// restIsZero reports whether the header already read and the rest of the
// file are all zero bytes.
func (rr *recordReader) restIsZero(read []byte) (bool, error) {
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
			return false, fmt.Errorf("embedded index: read %s: %w", rr.path, err)
		}
		if b != 0 {
			return false, nil
		}
	}
}
