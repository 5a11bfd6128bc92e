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
	payload    []byte
	// emission is the row's emission number, digits: "0" (or nil, on an
	// outbox without the column) for the original emission of an event.
	emission []byte
	// trace is the row's traceparent; nil for none.
	trace []byte
}

// reemission reports whether the row re-emits an event already emitted:
// an emission number other than 0.
func (v *insertView) reemission() bool {
	return len(v.emission) > 1 || (len(v.emission) == 1 && v.emission[0] != '0')
}

// messageID is the row's Nats-Msg-Id and, for a re-emission, the value of
// its re-emission header (nil otherwise). An original emission's id is the
// event id; a re-emission's is "<event id>.<emission>", which the stream's
// duplicate window has not seen, while a republish of the same
// re-emission (after a relay restart) is still dropped. The original
// emission, the hot path, costs one allocation: the id's string.
func (v *insertView) messageID() (string, []string) {
	if !v.reemission() {
		return string(v.eventID), nil
	}
	return string(v.eventID) + "." + string(v.emission), []string{string(v.emission)}
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
	v.emission, v.trace = nil, nil
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
		case r.payload:
			dst = &v.payload
		case r.emission:
			if kind != 't' {
				return fmt.Errorf("relay: outbox column %d (emission) arrived as %q, want a text value", i, kind)
			}
			v.emission = val
			continue
		case r.trace:
			v.trace = val // nil for a NULL
			continue
		default:
			continue
		}
		if kind != 't' {
			return fmt.Errorf("relay: outbox column %d arrived as %q, want a text value", i, kind)
		}
		*dst = val
		found++
	}
	if found != 4 {
		return fmt.Errorf("relay: outbox insert lacks columns (%d of 4 found)", found)
	}
	if r.emission >= 0 && v.emission == nil {
		return fmt.Errorf("relay: outbox insert lacks its emission column")
	}
	if !isDigits(v.version) {
		return fmt.Errorf("relay: outbox version %q is not an integer", v.version)
	}
	if v.emission != nil && !isDigits(v.emission) {
		return fmt.Errorf("relay: outbox emission %q is not an integer", v.emission)
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

// effectsTarget is the subject, and the stream, of the copy for effects of
// an event whose subject in the documents' stream is docsSubject: the
// effects' stream's, or its partition's when the effects have partitions.
// The token is taken from docsSubject, not hashed again.
func (r *Relay) effectsTarget(docsSubject string) (subject, stream string) {
	token := docsSubject[len(contract.DocsSubjectPrefix):]
	if n := r.cfg.Effects.Partitions; n > 1 {
		p := contract.TokenPartition(token, n)
		return r.effectsPrefixes[p] + token, r.effectsStreams[p]
	}
	return contract.EventsSubjectPrefix + token, r.cfg.Effects.Name
}
