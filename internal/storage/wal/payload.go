package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Payloads are a store's own; these helpers write and read the fields they
// are made of: integers as varints, strings as a length and bytes, flags
// as one byte 0 or 1.

// AppendString appends s as its length and bytes.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// SealList seals a record of kind op holding items, each written by
// appendItem after their count; size bounds the bytes an item takes, so
// that the record is allocated once.
func SealList[T any](op byte, items []T, size func(T) int, appendItem func([]byte, T) []byte) ([]byte, error) {
	return SealListInto(nil, op, items, size, appendItem)
}

// SealListInto is SealList building the record in buf when it has the
// room, so that a writer of many records (a snapshot) reuses one buffer
// instead of allocating each record.
func SealListInto[T any](buf []byte, op byte, items []T, size func(T) int, appendItem func([]byte, T) []byte) ([]byte, error) {
	n := 1 + binary.MaxVarintLen64
	for _, it := range items {
		n += size(it)
	}
	var b []byte
	if cap(buf) >= HeaderSize+n {
		b = buf[:HeaderSize]
	} else {
		b = NewRecord(n)
	}
	b = append(b, op)
	b = binary.AppendUvarint(b, uint64(len(items)))
	for _, it := range items {
		b = appendItem(b, it)
	}
	return Seal(b)
}

// AppendBool appends v as one byte.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// Decoder reads the fields of a payload. The first failure sticks: later
// reads return zero values and [Decoder.Finish] reports it.
type Decoder struct {
	b   []byte
	err error
}

// NewDecoder reads payload; strings it returns are copies, so the payload
// may be reused after decoding.
func NewDecoder(payload []byte) *Decoder { return &Decoder{b: payload} }

var errShort = errors.New("payload ends early")

// Fail records err as the decoder's failure, unless one is recorded.
func (d *Decoder) Fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

// Err is the first failure, if any.
func (d *Decoder) Err() error { return d.err }

// Remaining is the number of bytes not read yet.
func (d *Decoder) Remaining() int { return len(d.b) }

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if len(d.b) < 1 {
		d.Fail(errShort)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// Bool reads a flag written by [AppendBool].
func (d *Decoder) Bool() bool {
	switch d.Byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.Fail(errors.New("bad flag"))
	return false
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 { return readVarint(d, binary.Uvarint) }

// Varint reads a signed varint.
func (d *Decoder) Varint() int64 { return readVarint(d, binary.Varint) }

func readVarint[T uint64 | int64](d *Decoder, read func([]byte) (T, int)) T {
	v, n := read(d.b)
	if n <= 0 {
		d.Fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Count reads a length whose items take at least minSize bytes each, so
// that a damaged count cannot make the decoder allocate more than the
// payload could hold.
func (d *Decoder) Count(minSize int) int {
	n := d.Uvarint()
	if n > uint64(len(d.b)/minSize) {
		d.Fail(fmt.Errorf("count %d exceeds the payload", n))
		return 0
	}
	return int(n)
}

// Str reads a string written by [AppendString].
func (d *Decoder) Str() string {
	n := d.Count(1)
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Fixed reads the next n bytes. They are the payload's own, not a copy.
func (d *Decoder) Fixed(n int) []byte {
	if len(d.b) < n {
		d.Fail(errShort)
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

// Finish reports the first failure, or bytes left over after the last
// field.
func (d *Decoder) Finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.Fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	return d.err
}
