package relay

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	eventID  string
	key      string
	version  string
	payload  []byte
	emission string // "" when the relation has no emission column
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
	}{{r.eventID, "event_id", &row.eventID}, {r.key, "key", &row.key}, {r.version, "version", &row.version}} {
		b, err := text(f.i, f.name)
		if err != nil {
			return outboxRow{}, err
		}
		*f.dst = string(b)
	}
	if !bigintText(row.version) {
		return outboxRow{}, fmt.Errorf("relay: outbox version %q is not a bigint's text", row.version)
	}
	p, err := text(r.payload, "payload")
	if err != nil {
		return outboxRow{}, err
	}
	row.payload = append([]byte(nil), p...)
	if r.emission >= 0 {
		e, err := text(r.emission, "emission")
		if err != nil {
			return outboxRow{}, err
		}
		if !bigintText(string(e)) {
			return outboxRow{}, fmt.Errorf("relay: outbox emission %q is not a bigint's text", e)
		}
		row.emission = string(e)
	}
	return row, nil
}

// bigintText reports whether s is digits only, as a non-negative bigint's
// text is: 19 of them at most.
func bigintText(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil && len(s) <= 19
}

// agree reports whether the fast decoder's view and the reference decoder's
// row hold the same fields.
func agree(v *insertView, row outboxRow) bool {
	return string(v.eventID) == row.eventID && string(v.key) == row.key && string(v.version) == row.version &&
		string(v.payload) == string(row.payload) && string(v.emission) == row.emission
}

// The relations of the outbox: schema version 1 (no emission column),
// version 2 (emission added last, as ALTER TABLE ADD COLUMN does), and one
// with the columns in another order.
var (
	relationV1       = relation{id: 42, eventID: 0, key: 1, version: 2, payload: 4, emission: -1, trace: -1}
	relationV2       = relation{id: 42, eventID: 0, key: 1, version: 2, payload: 4, emission: 6, trace: -1}
	relationShuffled = relation{id: 42, eventID: 5, key: 3, version: 0, payload: 1, emission: 2, trace: -1}
	// Schema version 6: trace_context added last.
	relationV6 = relation{id: 42, eventID: 0, key: 1, version: 2, payload: 4, emission: 6, trace: 7}
)

// The trace context of a row of schema version 6 is read, a NULL one is
// none, and a view reused for a row without one holds none.
func TestDecodeInsertFastReadsTheTraceContext(t *testing.T) {
	id, key, payload := []byte("b53816c2-2637-57ba-b67b-7a12f08cacb8"), []byte("docs/a"), []byte(`{"schema":"x"}`)
	created := []byte("2026-11-30 08:00:00+00")
	tp := []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	var v insertView
	if err := relationV6.decodeInsertFast(insertMessage(42, id, key, []byte("3"), []byte("document.upserted"), payload, created, []byte("0"), tp), &v); err != nil {
		t.Fatal(err)
	}
	if string(v.trace) != string(tp) || string(v.payload) != string(payload) {
		t.Fatalf("trace %q, payload %q", v.trace, v.payload)
	}
	if err := relationV6.decodeInsertFast(insertMessage(42, id, key, []byte("3"), []byte("document.upserted"), payload, created, []byte("0"), nil), &v); err != nil || v.trace != nil {
		t.Fatalf("a NULL trace context: %q, %v", v.trace, err)
	}
	_ = relationV6.decodeInsertFast(insertMessage(42, id, key, []byte("3"), []byte("document.upserted"), payload, created, []byte("0"), tp), &v)
	if err := relationV2.decodeInsertFast(insertMessage(42, id, key, []byte("3"), []byte("document.upserted"), payload, created, []byte("0")), &v); err != nil || v.trace != nil {
		t.Fatalf("a schema 2 row after a traced one: %q, %v", v.trace, err)
	}
}

// The fast decoder must agree with pglogrepl's on every field, on the
// outbox of either schema version.
func TestDecodeInsertFastAgreesWithPglogrepl(t *testing.T) {
	id, key, payload := []byte("b53816c2-2637-57ba-b67b-7a12f08cacb8"), []byte("docs/a"), []byte(`{"schema":"x"}`)
	created := []byte("2026-11-30 08:00:00+00")
	for _, tc := range []struct {
		name       string
		rel        relation
		msg        []byte
		reemission bool
	}{
		{"schema 1", relationV1, insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created), false},
		{"schema 2, original", relationV2, insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created, []byte("0")), false},
		{"schema 2, re-emission", relationV2, insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created, []byte("9223372036854775807")), true},
		{"columns reordered", relationShuffled, insertMessage(42, []byte("17"), payload, []byte("12"), key, created, id, []byte("document.withdrawn")), true},
	} {
		var v insertView
		if err := tc.rel.decodeInsertFast(tc.msg, &v); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		parsed, err := pglogrepl.Parse(tc.msg)
		if err != nil {
			t.Fatal(err)
		}
		row, err := tc.rel.decodeInsert(parsed.(*pglogrepl.InsertMessage))
		if err != nil {
			t.Fatalf("%s: reference: %v", tc.name, err)
		}
		if !agree(&v, row) || v.reemission() != tc.reemission {
			t.Fatalf("%s: fast %+v (re-emission %v), pglogrepl %+v", tc.name, v, v.reemission(), row)
		}
	}
	// A view reused for a row of the old schema holds no emission.
	var v insertView
	_ = relationV2.decodeInsertFast(insertMessage(42, id, key, []byte("1"), []byte("k"), payload, created, []byte("5")), &v)
	if err := relationV1.decodeInsertFast(insertMessage(42, id, key, []byte("1"), []byte("k"), payload), &v); err != nil || v.reemission() {
		t.Fatalf("a schema 1 row after a re-emission: %v, re-emission %v", err, v.reemission())
	}

	msg := insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created, []byte("3"))
	for name, bad := range map[string]struct {
		rel relation
		msg []byte
	}{
		"other relation":     {relationV1, insertMessage(7, []byte("x"))},
		"truncated":          {relationV2, msg[:len(msg)-3]},
		"null key":           {relationV1, insertMessage(42, []byte("id"), nil, []byte("1"), []byte("k"), []byte("{}"))},
		"version not digit":  {relationV1, insertMessage(42, []byte("id"), []byte("k"), []byte("1a"), []byte("k"), []byte("{}"))},
		"missing columns":    {relationV1, insertMessage(42, []byte("id"), []byte("k"))},
		"payload missing":    {relationV1, insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("k"))},
		"event id null":      {relationV1, insertMessage(42, nil, []byte("k"), []byte("1"), []byte("k"), []byte("{}"))},
		"not an insert":      {relationV1, append([]byte{'U'}, msg[1:]...)},
		"emission missing":   {relationV2, insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("k"), []byte("{}"), created)},
		"emission null":      {relationV2, insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("k"), []byte("{}"), created, nil)},
		"emission not digit": {relationV2, insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("k"), []byte("{}"), created, []byte("-1"))},
	} {
		if err := bad.rel.decodeInsertFast(bad.msg, &v); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// The fast decoder never accepts what the reference decoder refuses, and
// agrees with it on what it accepts, on the outbox of either schema.
func FuzzDecodeInsertFast(f *testing.F) {
	created := []byte("2026-11-30 08:00:00+00")
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("document.upserted"), []byte("{}")))
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("document.upserted"), []byte("{}"), created, []byte("0")))
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("1"), []byte("document.upserted"), []byte("{}"), created, []byte("12")))
	f.Add(insertMessage(42, []byte("1"), []byte("{}"), []byte("7"), []byte("k"), created, []byte("id"), []byte("document.withdrawn")))
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("9999999999999999999"), []byte("k"), []byte("{}"), created, []byte("9999999999999999999")))
	f.Add(insertMessage(42, []byte("id"), []byte("k"), []byte("+1"), []byte("k"), []byte("{}"), created, []byte("-1")))
	f.Add([]byte{'I', 0, 0, 0, 42, 'N', 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, rel := range []relation{relationV1, relationV2, relationShuffled} {
			var v insertView
			if err := rel.decodeInsertFast(data, &v); err != nil {
				continue
			}
			if !isDigits(v.version) || v.key == nil || v.payload == nil || (rel.emission >= 0 && !isDigits(v.emission)) {
				t.Fatalf("accepted an insert without its columns: %+v", v)
			}
			parsed, err := pglogrepl.Parse(data)
			if err != nil {
				t.Fatalf("fast accepted what pglogrepl cannot parse: %v", err)
			}
			m, ok := parsed.(*pglogrepl.InsertMessage)
			if !ok {
				t.Fatalf("fast accepted a %T", parsed)
			}
			row, err := rel.decodeInsert(m)
			if err != nil {
				t.Fatalf("fast accepted what the reference refuses: %v", err)
			}
			if !agree(&v, row) {
				t.Fatalf("fast %+v, reference %+v", v, row)
			}
		}
	})
}

// The hot path stays allocation-free: decoding an insert allocates
// nothing on either schema, and an original emission's message id costs
// only its string, as before re-emissions existed.
func TestOriginalEmissionAllocatesNothingMore(t *testing.T) {
	id, key, payload := []byte("b53816c2-2637-57ba-b67b-7a12f08cacb8"), []byte("docs/a"), []byte(`{"schema":"x"}`)
	created := []byte("2026-11-30 08:00:00+00")
	v1 := insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload)
	v2 := insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created, []byte("0"))
	again := insertMessage(42, id, key, []byte("17"), []byte("document.upserted"), payload, created, []byte("31"))
	var v insertView
	var sink string
	for _, tc := range []struct {
		name      string
		rel       relation
		msg       []byte
		reemitted bool
		id        string
	}{
		{"schema 1", relationV1, v1, false, string(id)},
		{"schema 2, original", relationV2, v2, false, string(id)},
		{"schema 2, re-emission", relationV2, again, true, string(id) + ".31"},
	} {
		decode := testing.AllocsPerRun(200, func() {
			if err := tc.rel.decodeInsertFast(tc.msg, &v); err != nil {
				t.Fatal(err)
			}
		})
		if decode != 0 {
			t.Errorf("%s: decoding allocates %v times, want 0", tc.name, decode)
		}
		msgID := testing.AllocsPerRun(200, func() {
			id, hdr := v.messageID()
			sink = id
			if hdr != nil {
				sink += hdr[0]
			}
		})
		if !tc.reemitted && msgID != 1 {
			t.Errorf("%s: the message id allocates %v times, want 1", tc.name, msgID)
		}
		if got, hdr := v.messageID(); got != tc.id || (hdr != nil) != tc.reemitted {
			t.Errorf("%s: message id %q, header %v; want %q", tc.name, got, hdr, tc.id)
		}
	}
	_ = sink
}

// A relation message maps the columns the relay reads wherever they are,
// without kind or emission, and one lacking a column it reads is refused
// with the relation named.
func TestNewRelation(t *testing.T) {
	rel := func(cols ...string) *pglogrepl.RelationMessage {
		m := &pglogrepl.RelationMessage{RelationID: 42, Namespace: "public", RelationName: "outbox"}
		for _, c := range cols {
			m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: c})
		}
		return m
	}
	for _, tc := range []struct {
		cols []string
		want relation
	}{
		{[]string{"event_id", "key", "version", "kind", "payload", "created_at"}, relationV1},
		{[]string{"event_id", "key", "version", "kind", "payload", "created_at", "emission"}, relationV2},
		{[]string{"version", "payload", "emission", "key", "created_at", "event_id", "kind"}, relationShuffled},
		{[]string{"payload", "key", "event_id", "version"}, relation{id: 42, eventID: 2, key: 1, version: 3, payload: 0, emission: -1, trace: -1}},
		{[]string{"event_id", "key", "version", "kind", "payload", "created_at", "emission", "trace_context"}, relationV6},
	} {
		got, err := newRelation(rel(tc.cols...))
		tc.want.namespace, tc.want.name = "public", "outbox"
		if err != nil || got != tc.want {
			t.Errorf("columns %v: %+v, %v; want %+v", tc.cols, got, err, tc.want)
		}
	}
	for _, missing := range []string{"event_id", "key", "version", "payload"} {
		cols := slices.DeleteFunc([]string{"event_id", "key", "version", "kind", "payload", "emission"}, func(c string) bool { return c == missing })
		if _, err := newRelation(rel(cols...)); err == nil || !strings.Contains(err.Error(), "public.outbox") {
			t.Errorf("without %s: err %v; want the relation refused and named", missing, err)
		}
	}
}
