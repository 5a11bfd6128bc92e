package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
)

// Record payloads start with an op byte; integers are varints, strings a
// length and bytes, vectors a length and little-endian float32s.
const (
	opLogHeader      byte = 1 // magic, format, log sequence number
	opDimension      byte = 2 // dim
	opUpsert         byte = 3 // points
	opDeleteStale    byte = 4 // keeps
	opMarkers        byte = 5 // markers
	opSnapshotHeader byte = 6 // magic, format, next log sequence number, dim, point and marker counts
	opSnapshotEnd    byte = 7 // point and marker counts again
)

const (
	formatMagic   = "converge-index"
	formatVersion = 1
)

// record is a decoded payload; which fields are set depends on op.
type record struct {
	op       byte
	seq      uint64 // opLogHeader, opSnapshotHeader (the next log)
	dim      int    // opDimension, opSnapshotHeader
	points   []*index.Point
	keeps    []index.Keep
	markers  []index.Marker
	nPoints  uint64 // opSnapshotHeader, opSnapshotEnd
	nMarkers uint64
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPoint(b []byte, p *index.Point) []byte {
	b = append(b, p.ID[:]...)
	b = appendString(b, p.Key)
	b = binary.AppendVarint(b, p.Version)
	b = binary.AppendVarint(b, int64(p.Ordinal))
	b = appendString(b, p.ContentHash)
	b = appendString(b, p.ChunkHash)
	b = appendString(b, p.Title)
	// Zero is a nil tag list, n+1 a list of n, so that nil and empty
	// survive a round trip as they were written.
	if p.Tags == nil {
		b = append(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(p.Tags))+1)
		for _, t := range p.Tags {
			b = appendString(b, t)
		}
	}
	b = appendString(b, p.Text)
	b = binary.AppendUvarint(b, uint64(len(p.Vector)))
	for _, f := range p.Vector {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func pointSize(p *index.Point) int {
	n := 16 + 6*binary.MaxVarintLen64 + len(p.Key) + len(p.ContentHash) + len(p.ChunkHash) +
		len(p.Title) + len(p.Text) + 4*len(p.Vector) + 2*binary.MaxVarintLen64
	for _, t := range p.Tags {
		n += binary.MaxVarintLen64 + len(t)
	}
	return n
}

func appendHeader(b []byte, op byte, seq uint64) []byte {
	b = append(b, op)
	b = appendString(b, formatMagic)
	b = binary.AppendUvarint(b, formatVersion)
	return binary.AppendUvarint(b, seq)
}

func encodeLogHeader(seq uint64) ([]byte, error) {
	return sealRecord(appendHeader(newRecordBuf(32), opLogHeader, seq))
}

func encodeDimension(dim int) ([]byte, error) {
	b := append(newRecordBuf(8), opDimension)
	return sealRecord(binary.AppendUvarint(b, uint64(dim)))
}

func encodeUpsert(points []*index.Point) ([]byte, error) {
	size := 1 + binary.MaxVarintLen64
	for _, p := range points {
		size += pointSize(p)
	}
	b := append(newRecordBuf(size), opUpsert)
	b = binary.AppendUvarint(b, uint64(len(points)))
	for _, p := range points {
		b = appendPoint(b, p)
	}
	return sealRecord(b)
}

func encodeDeleteStale(keeps []index.Keep) ([]byte, error) {
	b := append(newRecordBuf(64*len(keeps)), opDeleteStale)
	b = binary.AppendUvarint(b, uint64(len(keeps)))
	for _, k := range keeps {
		b = appendString(b, k.Key)
		b = binary.AppendVarint(b, k.Version)
	}
	return sealRecord(b)
}

func encodeMarkers(markers []index.Marker) ([]byte, error) {
	b := append(newRecordBuf(96*len(markers)), opMarkers)
	b = binary.AppendUvarint(b, uint64(len(markers)))
	for _, m := range markers {
		b = appendString(b, m.Key)
		b = binary.AppendVarint(b, m.Version)
		if m.Deleted {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendString(b, m.ContentHash)
	}
	return sealRecord(b)
}

func encodeSnapshotHeader(nextSeq uint64, dim int, nPoints, nMarkers int) ([]byte, error) {
	b := appendHeader(newRecordBuf(64), opSnapshotHeader, nextSeq)
	b = binary.AppendUvarint(b, uint64(dim))
	b = binary.AppendUvarint(b, uint64(nPoints))
	return sealRecord(binary.AppendUvarint(b, uint64(nMarkers)))
}

func encodeSnapshotEnd(nPoints, nMarkers int) ([]byte, error) {
	b := append(newRecordBuf(24), opSnapshotEnd)
	b = binary.AppendUvarint(b, uint64(nPoints))
	return sealRecord(binary.AppendUvarint(b, uint64(nMarkers)))
}

// decoder reads a payload; the first failure sticks and later reads return
// zero values.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("payload ends early")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) u8() byte {
	if len(d.b) < 1 {
		d.fail(errShort)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length whose items take at least minSize bytes each, so
// that a damaged count cannot make the decoder allocate more than the
// payload could hold.
func (d *decoder) count(minSize int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/minSize) {
		d.fail(fmt.Errorf("count %d exceeds the payload", n))
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.count(1)
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) point() *index.Point {
	p := &index.Point{}
	if len(d.b) < 16 {
		d.fail(errShort)
		return p
	}
	p.ID = uuid.UUID(d.b[:16])
	d.b = d.b[16:]
	p.Key = d.str()
	p.Version = d.varint()
	p.Ordinal = int(d.varint())
	p.ContentHash = d.str()
	p.ChunkHash = d.str()
	p.Title = d.str()
	if n := d.uvarint(); n > 0 {
		if n-1 > uint64(len(d.b)) {
			d.fail(fmt.Errorf("tag count %d exceeds the payload", n-1))
			return p
		}
		p.Tags = make([]string, n-1)
		for i := range p.Tags {
			p.Tags[i] = d.str()
		}
	}
	p.Text = d.str()
	if n := d.count(4); n > 0 {
		p.Vector = make([]float32, n)
		for i := range p.Vector {
			p.Vector[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.b[4*i:]))
		}
		d.b = d.b[4*n:]
	}
	return p
}

func (d *decoder) header() uint64 {
	if m := d.str(); d.err == nil && m != formatMagic {
		d.fail(fmt.Errorf("not an index file (magic %q)", m))
	}
	if v := d.uvarint(); d.err == nil && v != formatVersion {
		d.fail(fmt.Errorf("format version %d, this build reads %d", v, formatVersion))
	}
	return d.uvarint()
}

// decodeRecord decodes a payload. Strings and vectors are copied, so the
// payload may be reused.
func decodeRecord(payload []byte) (record, error) {
	d := &decoder{b: payload}
	r := record{op: d.u8()}
	switch r.op {
	case opLogHeader:
		r.seq = d.header()
	case opDimension:
		r.dim = int(d.uvarint())
	case opUpsert:
		r.points = make([]*index.Point, d.count(16))
		for i := range r.points {
			r.points[i] = d.point()
		}
	case opDeleteStale:
		r.keeps = make([]index.Keep, d.count(2))
		for i := range r.keeps {
			r.keeps[i] = index.Keep{Key: d.str(), Version: d.varint()}
		}
	case opMarkers:
		r.markers = make([]index.Marker, d.count(4))
		for i := range r.markers {
			m := index.Marker{Key: d.str(), Version: d.varint()}
			switch d.u8() {
			case 0:
			case 1:
				m.Deleted = true
			default:
				d.fail(errors.New("bad deleted flag"))
			}
			m.ContentHash = d.str()
			r.markers[i] = m
		}
	case opSnapshotHeader:
		r.seq = d.header()
		r.dim = int(d.uvarint())
		r.nPoints = d.uvarint()
		r.nMarkers = d.uvarint()
	case opSnapshotEnd:
		r.nPoints = d.uvarint()
		r.nMarkers = d.uvarint()
	default:
		d.fail(fmt.Errorf("unknown op %d", r.op))
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return record{}, d.err
	}
	return r, nil
}
