package relay

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// outboxRow is one decoded outbox insert.
type outboxRow struct {
	eventID string
	key     string
	version string
	kind    string
	payload []byte
}

// relation maps the outbox's columns to their positions, learned from the
// relation message pgoutput sends before the first row (and again after a
// schema change), so column order is never assumed.
type relation struct {
	id                                   uint32
	eventID, key, version, kind, payload int
	namespace, name                      string
}

var errNotOutbox = errors.New("relay: change is not for the outbox")

func newRelation(m *pglogrepl.RelationMessage) (relation, error) {
	r := relation{id: m.RelationID, namespace: m.Namespace, name: m.RelationName,
		eventID: -1, key: -1, version: -1, kind: -1, payload: -1}
	for i, c := range m.Columns {
		switch c.Name {
		case "event_id":
			r.eventID = i
		case "key":
			r.key = i
		case "version":
			r.version = i
		case "kind":
			r.kind = i
		case "payload":
			r.payload = i
		}
	}
	if r.eventID < 0 || r.key < 0 || r.version < 0 || r.kind < 0 || r.payload < 0 {
		return r, fmt.Errorf("relay: relation %s.%s lacks an outbox column (event_id, key, version, kind, payload)", m.Namespace, m.RelationName)
	}
	return r, nil
}

// decodeInsert extracts an outbox row from an insert. The payload is copied:
// the tuple points into the receive buffer, which the next read reuses.
func (r relation) decodeInsert(m *pglogrepl.InsertMessage) (outboxRow, error) {
	if m.RelationID != r.id {
		return outboxRow{}, errNotOutbox
	}
	cols := m.Tuple.Columns
	text := func(i int, name string) ([]byte, error) {
		if i >= len(cols) {
			return nil, fmt.Errorf("relay: outbox row has %d columns, %s is column %d", len(cols), name, i)
		}
		if cols[i].DataType != pglogrepl.TupleDataTypeText {
			return nil, fmt.Errorf("relay: outbox column %s arrived as %q, want text", name, cols[i].DataType)
		}
		return cols[i].Data, nil
	}
	var row outboxRow
	for _, f := range []struct {
		i    int
		name string
		dst  *string
	}{{r.eventID, "event_id", &row.eventID}, {r.key, "key", &row.key}, {r.version, "version", &row.version}, {r.kind, "kind", &row.kind}} {
		b, err := text(f.i, f.name)
		if err != nil {
			return outboxRow{}, err
		}
		*f.dst = string(b)
	}
	if _, err := strconv.ParseInt(row.version, 10, 64); err != nil {
		return outboxRow{}, fmt.Errorf("relay: outbox version %q: %w", row.version, err)
	}
	p, err := text(r.payload, "payload")
	if err != nil {
		return outboxRow{}, err
	}
	row.payload = append([]byte(nil), p...)
	return row, nil
}
