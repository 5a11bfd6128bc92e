package corpus_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// digest hashes every op of c, in order.
func digest(t *testing.T, c *corpus.Corpus) string {
	t.Helper()
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, o := range c.Ops {
		if err := enc.Encode(o); err != nil {
			t.Fatal(err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The writer's doubled-run test asserts counts of this corpus; a change of
// the generator changes them, and must be made on purpose.
func TestGenerateKnownAnswer(t *testing.T) {
	c := corpus.Generate(0x5eedd0b1ed, 1100)
	withdrawnAtEnd := 0
	for _, k := range c.Keys {
		if c.Final[k].Withdraw {
			withdrawnAtEnd++
		}
	}
	got := []int{len(c.Keys), len(c.Ops), c.Upserts(), withdrawnAtEnd}
	if want := []int{1100, 2850, 2686, 127}; !slices.Equal(got, want) {
		t.Errorf("keys, ops, upserts, keys ending withdrawn: %v, want %v", got, want)
	}
	if got, want := digest(t, c), "1dbb16b9a9b93919a0e5d9f94d06833f108bb940cd3352ba3c9d2f7c05d93392"; got != want {
		t.Errorf("digest %s, want %s", got, want)
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := corpus.Generate(7, 300), corpus.Generate(7, 300)
	if digest(t, a) != digest(t, b) {
		t.Fatal("one seed gave two corpora")
	}
	if digest(t, a) == digest(t, corpus.Generate(8, 300)) {
		t.Fatal("two seeds gave one corpus")
	}
}

func TestGenerateIsValidAndConsistent(t *testing.T) {
	c := corpus.Generate(1, 500)
	if len(c.Keys) != 500 || !slices.Equal(c.Keys[:len(corpus.SpecialKeys)], corpus.SpecialKeys) {
		t.Fatalf("%d keys; want 500, SpecialKeys first", len(c.Keys))
	}
	if got := len(corpus.LongKey()); got != contract.MaxKeyBytes {
		t.Errorf("LongKey is %d bytes, want %d", got, contract.MaxKeyBytes)
	}
	n := 0
	for _, k := range c.Keys {
		ops := c.ByKey[k]
		if len(ops) == 0 || c.Final[k] != ops[len(ops)-1] {
			t.Fatalf("%q: %d ops, final %v", k, len(ops), c.Final[k])
		}
		for i, o := range ops {
			n++
			if o.Key != k || (i > 0 && o.Version <= ops[i-1].Version) {
				t.Errorf("%s: not in version order of %q", o, k)
			}
			if c.Lookup(o.Key, o.Version, o.Kind()) != o {
				t.Errorf("Lookup does not find %s", o)
			}
			if _, err := o.Document.Normalize(); err != nil {
				t.Errorf("%s: %v", o, err)
			}
			if o.Withdraw && (o.Title != "" || o.Body != "" || o.Links != nil || o.Tags != nil || o.Meta != nil) {
				t.Errorf("%s has content", o)
			}
		}
	}
	if n != len(c.Ops) {
		t.Errorf("ByKey holds %d ops, Ops %d", n, len(c.Ops))
	}
	if c.Lookup("a/b", -1, contract.KindUpserted) != nil {
		t.Error("Lookup found an op of no version")
	}
}

func TestSequential(t *testing.T) {
	if got := corpus.Sequential(2, corpus.Shape{}); !reflect.DeepEqual(got, []contract.Document{
		{Key: "doc-0", Version: 1, Links: []string{}, Tags: []string{}, Meta: json.RawMessage("{}")},
		{Key: "doc-1", Version: 1, Links: []string{}, Tags: []string{}, Meta: json.RawMessage("{}")},
	}) {
		t.Errorf("zero shape: %+v", got)
	}
	docs := corpus.Sequential(2, corpus.Shape{First: 5, Keys: "k/%03d", Version: 9, Title: corpus.Fixed("t"),
		Body:  func(i int) string { return "body of " + string(rune('a'+i)) },
		Links: func(i int) []string { return []string{"z", "a", "z"} },
		Tags:  corpus.Fixed([]string{"x"}),
		Meta:  json.RawMessage(`{"b": 1, "a": 2}`)})
	want := contract.Document{Key: "k/006", Version: 9, Title: "t", Body: "body of g",
		Links: []string{"a", "z"}, Tags: []string{"x"}, Meta: json.RawMessage(`{"a":2,"b":1}`)}
	if len(docs) != 2 || !reflect.DeepEqual(docs[1], want) {
		t.Errorf("got %+v, want second %+v", docs, want)
	}
}

func TestFilledParagraphs(t *testing.T) {
	body := corpus.FilledParagraphs(4, 1000, "alpha", "beta", "gamma")
	for i := range 3 {
		b := body(i)
		if len(b) < 4000 || len(b) > 4020 {
			t.Errorf("body %d is %d bytes, want about 4000", i, len(b))
		}
		if n := len(chunking.Split(b, chunking.DefaultConfig())); n != 4 {
			t.Errorf("body %d makes %d chunks, want 4", i, n)
		}
	}
	if body(0) == body(1) {
		t.Error("documents 0 and 1 have one body")
	}
	evs := corpus.UpsertedEvents(corpus.Sequential(3, corpus.Shape{Body: body}))
	if len(evs) != 3 || len(evs[2].Chunks) != 4 || evs[2].Key != "doc-2" {
		t.Errorf("events %+v", evs)
	}
}
