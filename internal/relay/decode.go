package relay

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// relation maps the outbox columns the relay reads to their positions,
// learned from the relation message pgoutput sends before the first row
// (and again after a schema change), so column order is never assumed.
// Other columns (kind, created_at) are not read: the payload carries the
// event whole. emission is optional
// (-1 when absent): the outbox of schema version 1 has no such column, and
// all its rows are original emissions. So is trace (trace_context, schema
// version 6): the traceparent the writer stored with the row.
type relation struct {
	id                             uint32
	eventID, key, version, payload int
	emission, trace                int
	namespace, name                string
}

var errNotOutbox = errors.New("relay: change is not for the outbox")

func newRelation(m *pglogrepl.RelationMessage) (relation, error) {
	r := relation{id: m.RelationID, namespace: m.Namespace, name: m.RelationName,
		eventID: -1, key: -1, version: -1, payload: -1, emission: -1, trace: -1}
	for i, c := range m.Columns {
		switch c.Name {
		case "event_id":
			r.eventID = i
		case "key":
			r.key = i
		case "version":
			r.version = i
		case "payload":
			r.payload = i
		case "emission":
			r.emission = i
		case "trace_context":
			r.trace = i
		}
	}
	if r.eventID < 0 || r.key < 0 || r.version < 0 || r.payload < 0 {
		return r, fmt.Errorf("relay: relation %s.%s lacks an outbox column (event_id, key, version, payload)", m.Namespace, m.RelationName)
	}
	return r, nil
}
