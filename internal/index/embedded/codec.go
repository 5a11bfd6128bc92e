package embedded

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal"
)

// indexFormat heads every log and snapshot of the index.
var indexFormat = wal.Format{Magic: "converge-index", Version: 1}

// Record payloads start with an op byte (the kinds the log writes itself,
// wal.KindLogHeader and the snapshot's header and end, are not among
// them); integers are varints, strings a length and bytes, vectors a
// length and little-endian float32s.
const (
	opDimension   byte = 2 // dim
	opUpsert      byte = 3 // points
	opDeleteStale byte = 4 // keeps: a key's points of other versions (0: all); logs of before opDeleteOlder
	opMarkers     byte = 5 // markers
	opDeleteOlder byte = 6 // keeps: a key's points of older versions (0: all)
	opRetract     byte = 7 // keeps: a key's points of exactly the version
)

// record is a decoded payload; which fields are set depends on op.
type record struct {
	op      byte
	dim     int // opDimension
	points  []*index.Point
	keeps   []index.Keep
	markers []index.Marker
}

func appendPoint(b []byte, p *index.Point) []byte {
	b = append(b, p.ID[:]...)
	b = wal.AppendString(b, p.Key)
	b = binary.AppendVarint(b, p.Version)
	b = binary.AppendVarint(b, int64(p.Ordinal))
	b = wal.AppendString(b, p.ContentHash)
	b = wal.AppendString(b, p.ChunkHash)
	b = wal.AppendString(b, p.Title)
	// Zero is a nil tag list, n+1 a list of n, so that nil and empty
	// survive a round trip as they were written.
	if p.Tags == nil {
		b = append(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(p.Tags))+1)
		for _, t := range p.Tags {
			b = wal.AppendString(b, t)
		}
	}
	b = wal.AppendString(b, p.Text)
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

func encodeDimension(dim int) ([]byte, error) {
	b := append(wal.NewRecord(8), opDimension)
	return wal.Seal(binary.AppendUvarint(b, uint64(dim)))
}

func encodeUpsert(points []*index.Point) ([]byte, error) { return encodeUpsertInto(nil, points) }

// encodeUpsertInto is encodeUpsert reusing buf (see wal.SealListInto).
func encodeUpsertInto(buf []byte, points []*index.Point) ([]byte, error) {
	return wal.SealListInto(buf, opUpsert, points, pointSize, appendPoint)
}

func encodeKeeps(op byte, keeps []index.Keep) ([]byte, error) {
	return wal.SealList(op, keeps,
		func(k index.Keep) int { return 2*binary.MaxVarintLen64 + len(k.Key) },
		func(b []byte, k index.Keep) []byte {
			b = wal.AppendString(b, k.Key)
			return binary.AppendVarint(b, k.Version)
		})
}

func encodeMarkers(markers []index.Marker) ([]byte, error) {
	return wal.SealList(opMarkers, markers,
		func(m index.Marker) int { return 3*binary.MaxVarintLen64 + 1 + len(m.Key) + len(m.ContentHash) },
		func(b []byte, m index.Marker) []byte {
			b = wal.AppendString(b, m.Key)
			b = binary.AppendVarint(b, m.Version)
			b = wal.AppendBool(b, m.Deleted)
			return wal.AppendString(b, m.ContentHash)
		})
}

// snapshotCounts are the snapshot's own fields of its header (with the
// dimension) and end records, checked against what it loads.
type snapshotCounts struct {
	dim      int
	nPoints  uint64
	nMarkers uint64
}

func (c snapshotCounts) appendHeader(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(c.dim))
	return c.appendEnd(b)
}

func (c snapshotCounts) appendEnd(b []byte) []byte {
	b = binary.AppendUvarint(b, c.nPoints)
	return binary.AppendUvarint(b, c.nMarkers)
}

func decodeSnapshotHeader(fields []byte) (snapshotCounts, error) {
	d := wal.NewDecoder(fields)
	c := snapshotCounts{dim: int(d.Uvarint()), nPoints: d.Uvarint(), nMarkers: d.Uvarint()}
	return c, d.Finish()
}

func decodeSnapshotEnd(fields []byte) (snapshotCounts, error) {
	d := wal.NewDecoder(fields)
	c := snapshotCounts{nPoints: d.Uvarint(), nMarkers: d.Uvarint()}
	return c, d.Finish()
}

func decodePoint(d *wal.Decoder) *index.Point {
	p := &index.Point{}
	if id := d.Fixed(16); id != nil {
		p.ID = uuid.UUID(id)
	}
	p.Key = d.Str()
	p.Version = d.Varint()
	p.Ordinal = int(d.Varint())
	p.ContentHash = d.Str()
	p.ChunkHash = d.Str()
	p.Title = d.Str()
	if n := d.Uvarint(); n > 0 {
		if n-1 > uint64(d.Remaining()) {
			d.Fail(fmt.Errorf("tag count %d exceeds the payload", n-1))
			return p
		}
		p.Tags = make([]string, n-1)
		for i := range p.Tags {
			p.Tags[i] = d.Str()
		}
	}
	p.Text = d.Str()
	if n := d.Count(4); n > 0 {
		raw := d.Fixed(4 * n)
		p.Vector = make([]float32, n)
		for i := range p.Vector {
			p.Vector[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return p
}

// MaxDimension is the largest vector dimension the embedded index takes
// (Qdrant's limit too).
const MaxDimension = 65536

// decodeRecord decodes a payload. Strings and vectors are copied, so the
// payload may be reused.
func decodeRecord(payload []byte) (record, error) {
	d := wal.NewDecoder(payload)
	r := record{op: d.Byte()}
	switch r.op {
	case opDimension:
		dim := d.Uvarint()
		if dim < 1 || dim > MaxDimension {
			d.Fail(fmt.Errorf("dimension %d is outside 1..%d", dim, MaxDimension))
		}
		r.dim = int(dim) //nolint:gosec // bounded just above
	case opUpsert:
		r.points = make([]*index.Point, d.Count(16))
		for i := range r.points {
			r.points[i] = decodePoint(d)
		}
	case opDeleteStale, opDeleteOlder, opRetract:
		r.keeps = make([]index.Keep, d.Count(2))
		for i := range r.keeps {
			r.keeps[i] = index.Keep{Key: d.Str(), Version: d.Varint()}
		}
	case opMarkers:
		r.markers = make([]index.Marker, d.Count(4))
		for i := range r.markers {
			r.markers[i] = index.Marker{Key: d.Str(), Version: d.Varint(), Deleted: d.Bool(), ContentHash: d.Str()}
		}
	default:
		d.Fail(fmt.Errorf("unknown op %d", r.op))
	}
	if err := d.Finish(); err != nil {
		return record{}, err
	}
	return r, nil
}
