package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Kinds of the payloads this package writes itself: a log's first record,
// and a snapshot's first and last. A store's own payloads start with a kind
// byte of their own, none of these.
const (
	KindLogHeader      byte = 1 // format, the log's sequence number
	KindSnapshotHeader byte = 6 // format, the first log not covered, then [Snapshot.Header]
	KindSnapshotEnd    byte = 7 // [Snapshot.End]
)

// Format names what a directory's files hold. Every log and snapshot
// starts with it, so that one store never reads another's files, nor a
// version of its own format it does not know.
type Format struct {
	Magic   string // e.g. "converge-index"
	Version uint64
}

func (f Format) appendHeader(b []byte, kind byte, seq uint64) []byte {
	b = append(b, kind)
	b = AppendString(b, f.Magic)
	b = binary.AppendUvarint(b, f.Version)
	return binary.AppendUvarint(b, seq)
}

// readHeader reads what appendHeader wrote after the kind byte and returns
// the sequence number.
func (f Format) readHeader(d *Decoder) uint64 {
	if m := d.Str(); d.Err() == nil && m != f.Magic {
		d.Fail(fmt.Errorf("not a %s file (magic %q)", f.Magic, m))
	}
	if v := d.Uvarint(); d.Err() == nil && v != f.Version {
		d.Fail(fmt.Errorf("format version %d, this build reads %d", v, f.Version))
	}
	return d.Uvarint()
}

func (f Format) validate() error {
	if f.Magic == "" {
		return errors.New("wal: the format has no magic")
	}
	return nil
}
