package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/deadletter/deadlettertest"
	"github.com/converge-sync/converge/pkg/contract"
)

// fakeWriter re-emits the documents it holds (key: current version) as
// the writer does: a key it does not hold is not found; a request with a
// key in irreproducible is refused whole; after failAfter answered
// requests (0: never), the next one fails.
type fakeWriter struct {
	docs           map[string]int64
	irreproducible map[string]bool
	failAfter      int
	requests       [][]string
	emission       int64
}

func newFakeWriter(docs map[string]int64) *fakeWriter {
	return &fakeWriter{docs: docs, irreproducible: map[string]bool{}}
}

var errUnavailable = errors.New("the writer at http://writer does not answer")

// notReproducible is how the writer's client reports a refusal, adapted.
type notReproducible struct{ key string }

func (e notReproducible) Error() string {
	return fmt.Sprintf("the writer refused the request: cannot re-emit %q (not_reproducible)", e.key)
}
func (notReproducible) Is(target error) bool { return target == deadletter.ErrNotReproducible }

func (w *fakeWriter) ReemitKeys(_ context.Context, keys []string) (deadletter.Reemission, error) {
	w.requests = append(w.requests, slices.Clone(keys))
	if w.failAfter > 0 && len(w.requests) > w.failAfter {
		return deadletter.Reemission{}, errUnavailable
	}
	for _, k := range keys {
		if w.irreproducible[k] {
			return deadletter.Reemission{}, notReproducible{k}
		}
	}
	var res deadletter.Reemission
	for _, k := range keys {
		v, ok := w.docs[k]
		if !ok {
			res.NotFound = append(res.NotFound, k)
			continue
		}
		w.emission++
		res.Reemitted = append(res.Reemitted, deadletter.ReemittedKey{Key: k, Version: v, EventID: uuid.NewSHA1(uuid.Nil, []byte(k)), Emission: w.emission})
	}
	return res, nil
}

func byKey(rs []deadletter.Redriven) map[string][]deadletter.Redriven {
	m := map[string][]deadletter.Redriven{}
	for _, r := range rs {
		k := r.Key
		if k == "" {
			k = r.Payload.String()
		}
		m[k] = append(m[k], r)
	}
	return m
}

// Every dead letter of a projector: the one whose data names no document
// and the one whose document the writer does not have stay, reported;
// the others are re-emitted once per key and deleted.
func TestRedriveReemitsDocuments(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	// A second dead letter of docs/a, of another version: one key, one
	// re-emission, both deleted.
	ev := contract.NewUpsertedEvent(contract.Document{Key: "docs/a", Version: 4, Title: "A", Body: "alpha 4"}, []string{"alpha 4"})
	data, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	fx.DeadLetter(t, "index", contract.Subject("docs/a"), data, "store_rejected")
	// And one of a partition's consumer (a projector run in partitions),
	// from the partitioned stream's subject of docs/a.
	fx.DeadLetter(t, "index", contract.PartitionSubjectPrefix(2)+contract.SubjectToken("docs/a"), data, "store_rejected")
	q := open(t, fx)
	idx := fx.Seqs["index"]
	docsBefore := deadlettertest.Msgs(t, fx.Docs)
	w := newFakeWriter(map[string]int64{"docs/a": 4})

	var got []deadletter.Redriven
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", All: true, Writer: w}, func(r deadletter.Redriven) { got = append(got, r) })
	if err != nil || n != 3 || len(got) != 5 {
		t.Fatalf("redrive: %d, %v, %+v", n, err, got)
	}
	if fmt.Sprint(w.requests) != "[[docs/a docs/c]]" {
		t.Fatalf("requests %v, want one request, each key once", w.requests)
	}
	m := byKey(got)
	for _, r := range m["docs/a"] {
		if r.Kept != "" || r.Path != deadletter.Reemit || r.Version != 4 || r.Emission != 1 || !fx.Gone(t, r.Seq) {
			t.Errorf("docs/a: %+v", r)
		}
	}
	if len(m["docs/a"]) != 3 {
		t.Errorf("docs/a: %+v", m["docs/a"])
	}
	if c := m["docs/c"]; len(c) != 1 || !strings.Contains(c[0].Kept, `no document "docs/c" (not found`) || c[0].Seq != idx[2] || fx.Gone(t, idx[2]) {
		t.Errorf("docs/c, which the writer does not have: %+v", c)
	}
	if fx.Gone(t, idx[1]) {
		t.Error("the dead letter that names no document was deleted")
	}
	for _, r := range got {
		if r.Seq == idx[1] && !strings.Contains(r.Kept, "names no document key") {
			t.Errorf("docs/b: %+v", r)
		}
	}
	if got := deadlettertest.Msgs(t, fx.Docs); got != docsBefore {
		t.Fatalf("the redrive published to %s: %d messages, want %d", contract.DocsStream, got, docsBefore)
	}
	if c, err := q.Count(ctx, "index"); err != nil || c != 2 {
		t.Fatalf("dead letters of index left: %d, %v; want docs/b's and docs/c's", c, err)
	}
}

// The writer refuses a whole request for one document it cannot
// reproduce: the redrive re-emits the others key by key and keeps that
// one's dead letter.
func TestRedriveKeepsIrreproducible(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	idx := fx.Seqs["index"]
	w := newFakeWriter(map[string]int64{"docs/a": 3, "docs/c": 2})
	w.irreproducible["docs/a"] = true

	var got []deadletter.Redriven
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[0], idx[2]}, Writer: w}, func(r deadletter.Redriven) { got = append(got, r) })
	if err != nil || n != 1 || len(got) != 2 {
		t.Fatalf("redrive: %d, %v, %+v", n, err, got)
	}
	if fmt.Sprint(w.requests) != "[[docs/a docs/c] [docs/a] [docs/c]]" {
		t.Fatalf("requests %v", w.requests)
	}
	m := byKey(got)
	if a := m["docs/a"]; len(a) != 1 || !strings.Contains(a[0].Kept, "cannot re-emit it") || !strings.Contains(a[0].Kept, "not_reproducible") || fx.Gone(t, idx[0]) {
		t.Errorf("docs/a, irreproducible: %+v", a)
	}
	if c := m["docs/c"]; len(c) != 1 || c[0].Kept != "" || c[0].Version != 2 || !fx.Gone(t, idx[2]) {
		t.Errorf("docs/c: %+v", c)
	}
}

// A dead letter goes only after the writer acknowledged its key: a writer
// that does not answer leaves every dead letter, and one that fails midway
// leaves those of the keys it did not answer.
func TestRedriveDeletesOnlyAcknowledged(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	idx := fx.Seqs["index"]
	before := deadlettertest.Msgs(t, fx.DLQ)

	unavailable := failingWriter{}
	var got []deadletter.Redriven
	n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "index", All: true, Writer: unavailable}, func(r deadletter.Redriven) { got = append(got, r) })
	if !errors.Is(err, errUnavailable) || n != 0 {
		t.Fatalf("redrive with the writer down: %d, %v", n, err)
	}
	// Only docs/b, which needs no writer to be kept, is reported.
	if len(got) != 1 || got[0].Seq != idx[1] || got[0].Kept == "" {
		t.Fatalf("reported %+v", got)
	}
	if deadlettertest.Msgs(t, fx.DLQ) != before {
		t.Fatal("a redrive the writer did not answer deleted dead letters")
	}

	// docs/a is irreproducible, so keys go one at a time; the writer
	// answers docs/a's refusal, then fails on docs/c.
	midway := newFakeWriter(map[string]int64{"docs/a": 3, "docs/c": 2})
	midway.irreproducible["docs/a"] = true
	midway.failAfter = 2
	got = nil
	n, err = q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[0], idx[2]}, Writer: midway}, func(r deadletter.Redriven) { got = append(got, r) })
	if !errors.Is(err, errUnavailable) || n != 0 || len(got) != 1 || got[0].Key != "docs/a" || got[0].Kept == "" {
		t.Fatalf("redrive failing midway: %d, %v, %+v", n, err, got)
	}
	if fx.Gone(t, idx[0]) || fx.Gone(t, idx[2]) {
		t.Fatal("a dead letter whose key was not acknowledged was deleted")
	}

	// A partial answer before the error: its keys' dead letters go.
	partial := &partialWriter{ack: "docs/a"}
	n, err = q.Redrive(ctx, deadletter.Redrive{Consumer: "index", Seqs: []uint64{idx[0], idx[2]}, Writer: partial}, nil)
	if !errors.Is(err, errUnavailable) || n != 1 || !fx.Gone(t, idx[0]) || fx.Gone(t, idx[2]) {
		t.Fatalf("redrive with a partial answer: %d, %v", n, err)
	}
}

type failingWriter struct{}

func (failingWriter) ReemitKeys(context.Context, []string) (deadletter.Reemission, error) {
	return deadletter.Reemission{}, errUnavailable
}

// partialWriter answers ack re-emitted, then fails, as the writer's
// client does when a later request of its pages fails.
type partialWriter struct{ ack string }

func (w *partialWriter) ReemitKeys(context.Context, []string) (deadletter.Reemission, error) {
	return deadletter.Reemission{Reemitted: []deadletter.ReemittedKey{{Key: w.ack, Version: 3, Emission: 9}}}, errUnavailable
}

// Document dead letters need a writer; ingest ones do not.
func TestRedriveWithoutWriter(t *testing.T) {
	ctx := context.Background()
	fx := deadlettertest.New(t)
	q := open(t, fx)
	before := deadlettertest.Msgs(t, fx.DLQ)
	for _, consumer := range []string{"index", "graph"} {
		if n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: consumer, All: true}, nil); !errors.Is(err, deadletter.ErrNoReemitter) || n != 0 {
			t.Errorf("redrive of %s without a writer: %d, %v", consumer, n, err)
		}
	}
	if deadlettertest.Msgs(t, fx.DLQ) != before {
		t.Fatal("a refused redrive changed the dead letters")
	}
	if n, err := q.Redrive(ctx, deadletter.Redrive{Consumer: "ingest", All: true}, nil); err != nil || n != 2 {
		t.Fatalf("redrive of ingest without a writer: %d, %v", n, err)
	}
}

func TestPathOf(t *testing.T) {
	for _, tc := range []struct {
		subject, stream string
		want            deadletter.Path
		err             string
	}{
		{contract.Subject("k"), contract.DocsStream, deadletter.Reemit, ""},
		{contract.Subject("k"), "", deadletter.Reemit, ""},
		{contract.Subject("k"), "OTHER", "", "not of the stream OTHER"},
		{contract.PartitionSubjectPrefix(3) + contract.SubjectToken("k"), contract.PartsStream, deadletter.Reemit, ""},
		{contract.PartitionSubjectPrefix(3) + contract.SubjectToken("k"), contract.DocsStream, "", "not of the stream CONVERGE_DOCS"},
		{contract.EventsSubject("k"), contract.EventsStream, deadletter.Reemit, ""},
		{contract.EventsSubject("k"), contract.DocsStream, "", "not of the stream CONVERGE_DOCS"},
		{contract.EventsPartitionSubjectPrefix(12) + contract.SubjectToken("k"), "CONVERGE_EVENTS_P12", deadletter.Reemit, ""},
		{contract.EventsPartitionSubjectPrefix(12) + contract.SubjectToken("k"), "", deadletter.Reemit, ""},
		{contract.EventsPartitionSubjectPrefix(12) + contract.SubjectToken("k"), contract.EventsStream, "", "not of the stream CONVERGE_EVENTS"},
		{contract.EffectsSubjectPrefix + "moved", "", "", "names no partition"},
		{contract.EffectsSubjectPrefix + "99.x", "", "", "names no partition"},
		{contract.IngestSubject("k"), "CONVERGE_INGEST", deadletter.Republish, ""},
		{contract.IngestSubject("k"), "", deadletter.Republish, ""},
		{"converge.other.x", "", "", "neither"},
		{"", contract.DocsStream, "", deadletter.HeaderSubject},
	} {
		got, err := deadletter.PathOf(tc.subject, tc.stream)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("PathOf(%q, %q) = %q, %v; want %q, %q", tc.subject, tc.stream, got, err, tc.want, tc.err)
		}
	}
}
