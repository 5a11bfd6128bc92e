package relay

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/converge-sync/converge/pkg/contract"
)

func TestSubjectOfMatchesContract(t *testing.T) {
	for _, k := range []string{"", "a", "docs/intro.md", "ключ with spaces.and.dots>*", string(make([]byte, 512))} {
		if got, want := subjectOf([]byte(k)), contract.Subject(k); got != want {
			t.Fatalf("subjectOf(%q) = %s, want %s", k, got, want)
		}
	}
}

// insertMessage encodes a pgoutput insert the way the server does.
func insertMessage(rel uint32, cols ...[]byte) []byte {
	b := []byte{'I', 0, 0, 0, 0, 'N', 0, 0}
	binary.BigEndian.PutUint32(b[1:5], rel)
	binary.BigEndian.PutUint16(b[6:8], uint16(len(cols)))
	for _, c := range cols {
		if c == nil {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't', 0, 0, 0, 0)
		binary.BigEndian.PutUint32(b[len(b)-4:], uint32(len(c)))
		b = append(b, c...)
	}
	return b
}

// outboxRow is one decoded outbox insert.
type outboxRow struct {
	eventID string
	key     string
	version string
	kind    string
	payload []byte
}

// decodeInsert is the reference decoder, over pglogrepl's parse.
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

// The fast decoder must agree with pglogrepl's on every field.
func TestDecodeInsertFastAgreesWithPglogrepl(t *testing.T) {
	rel := relation{id: 42, eventID: 0, key: 1, version: 2, kind: 3, payload: 4}
	msg := insertMessage(42, []byte("b53816c2-2637-57ba-b67b-7a12f08cacb8"), []byte("docs/a"), []byte("17"),
		[]byte("document.upserted"), []byte(`{"schema":"x"}`), []byte("2026-11-30 08:00:00+00"))
	var v insertView
	if err := rel.decodeInsertFast(msg, &v); err != nil {
		t.Fatal(err)
	}
	parsed, err := pglogrepl.Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	row, err := rel.decodeInsert(parsed.(*pglogrepl.InsertMessage))
	if err != nil {
		t.Fatal(err)
	}
	if string(v.eventID) != row.eventID || string(v.key) != row.key || string(v.version) != row.version ||
		string(v.kind) != row.kind || string(v.payload) != string(row.payload) {
		t.Fatalf("fast %+v, pglogrepl %+v", v, row)
	}
	for name, bad := range map[string][]byte{
		"other relation":    insertMessage(7, []byte("x")),
		"truncated":         msg[:len(msg)-3],
		"null key":          insertMessage(42, []byte("id"), nil, []byte("1"), []byte("k"), []byte("{}")),
		"version not digit": insertMessage(42, []byte("id"), []byte("k"), []byte("1a"), []byte("k"), []byte("{}")),
		"missing columns":   insertMessage(42, []byte("id"), []byte("k")),
		"not an insert":     append([]byte{'U'}, msg[1:]...),
	} {
		if err := rel.decodeInsertFast(bad, &v); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func FuzzDecodeInsertFast(f *testing.F) {
	rel := relation{id: 42, eventID: 0, key: 1, version: 2, kind: 3, payload: 4}
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("document.upserted"), []byte("{}")))
	f.Add([]byte{'I', 0, 0, 0, 42, 'N', 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var v insertView
		if err := rel.decodeInsertFast(data, &v); err != nil {
			return
		}
		if !isDigits(v.version) || v.key == nil || v.payload == nil {
			t.Fatalf("accepted an insert without its columns: %+v", v)
		}
	})
}
