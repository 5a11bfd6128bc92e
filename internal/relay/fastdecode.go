package relay

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/converge-sync/converge/pkg/contract"
)

// insertView is an outbox insert decoded in place: the byte slices point
// into the receive buffer and are valid only until the next read.
type insertView struct {
	relationID uint32
	eventID    []byte
	key        []byte
	version    []byte
	kind       []byte
	payload    []byte
}

// decodeInsertFast decodes a pgoutput Insert ('I') message for the outbox
// relation without allocating; the hot path of the relay. Other messages go
// through pglogrepl.Parse.
func (r relation) decodeInsertFast(data []byte, v *insertView) error {
	// 'I', int32 relation id, 'N', int16 column count, then per column a
	// kind byte ('n', 'u', 't', 'b') and for 't'/'b' an int32 length and data.
	if len(data) < 8 || data[0] != 'I' || data[5] != 'N' {
		return fmt.Errorf("relay: malformed insert message")
	}
	v.relationID = binary.BigEndian.Uint32(data[1:5])
	if v.relationID != r.id {
		return errNotOutbox
	}
	n := int(binary.BigEndian.Uint16(data[6:8]))
	pos := 8
	found := 0
	for i := 0; i < n; i++ {
		if pos >= len(data) {
			return fmt.Errorf("relay: insert message truncated at column %d", i)
		}
		kind := data[pos]
		pos++
		var val []byte
		switch kind {
		case 't':
			if pos+4 > len(data) {
				return fmt.Errorf("relay: insert message truncated at column %d", i)
			}
			l := int(binary.BigEndian.Uint32(data[pos : pos+4]))
			pos += 4
			if l < 0 || pos+l > len(data) {
				return fmt.Errorf("relay: insert column %d length %d out of range", i, l)
			}
			val = data[pos : pos+l]
			pos += l
		case 'n', 'u':
		default:
			return fmt.Errorf("relay: insert column %d has format %q, want text", i, kind)
		}
		var dst *[]byte
		switch i {
		case r.eventID:
			dst = &v.eventID
		case r.key:
			dst = &v.key
		case r.version:
			dst = &v.version
		case r.kind:
			dst = &v.kind
		case r.payload:
			dst = &v.payload
		default:
			continue
		}
		if kind != 't' {
			return fmt.Errorf("relay: outbox column %d arrived as %q, want a text value", i, kind)
		}
		*dst = val
		found++
	}
	if found != 5 {
		return fmt.Errorf("relay: outbox insert lacks columns (%d of 5 found)", found)
	}
	if !isDigits(v.version) {
		return fmt.Errorf("relay: outbox version %q is not an integer", v.version)
	}
	return nil
}

func isDigits(b []byte) bool {
	if len(b) == 0 || len(b) > 19 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// subjectOf is contract.Subject for a key given as bytes, in one allocation.
func subjectOf(key []byte) string {
	var buf [len(contract.DocsSubjectPrefix) + contract.TokenLength]byte
	n := copy(buf[:], contract.DocsSubjectPrefix)
	sum := sha256.Sum256(key)
	hex.Encode(buf[n:], sum[:contract.TokenLength/2])
	return string(buf[:])
}
