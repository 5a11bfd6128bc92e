package embed

import (
	"context"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/embed/embedtest"
)

type custom struct{ *Hash }

func (custom) Kind() string { return "custom" }

func TestIdentityOf(t *testing.T) {
	h, _ := NewHash(64)
	if got := IdentityOf(h); got != (Identity{Kind: KindHash, Model: "converge.hash.v1/64", Dimension: 64}) {
		t.Errorf("hash: %+v", got)
	}
	e, err := NewHTTP(HTTPConfig{URL: "http://127.0.0.1:1", Model: "m1", Dimension: 384})
	if err != nil {
		t.Fatal(err)
	}
	if got := IdentityOf(e); got != (Identity{Kind: KindHTTP, Model: "m1", Dimension: 384}) {
		t.Errorf("http: %+v", got)
	}
	c := &custom{Hash: h}
	if got := IdentityOf(c); got.Kind != "custom" || got.Dimension != 64 {
		t.Errorf("custom: %+v", got)
	}
	if s := IdentityOf(e).String(); s != `http model "m1", 384 dimensions` {
		t.Errorf("String: %s", s)
	}
}

func TestForIdentity(t *testing.T) {
	e, err := ForIdentity(Config{}, Identity{Kind: KindHash, Model: "converge.hash.v1/128", Dimension: 128})
	if err != nil || e.Dimension() != 128 || e.Name() != "converge.hash.v1/128" {
		t.Fatalf("hash: %v, %v", e, err)
	}
	// The endpoint configured now serves the recorded model, at its
	// recorded dimension.
	e, err = ForIdentity(Config{URL: "http://127.0.0.1:1", Model: "new", Dimension: 8, APIKey: "k"}, Identity{Kind: KindHTTP, Model: "old", Dimension: 16})
	if err != nil || IdentityOf(e) != (Identity{Kind: KindHTTP, Model: "old", Dimension: 16}) {
		t.Fatalf("http: %+v, %v", e, err)
	}
	for _, tc := range []struct {
		cfg  Config
		id   Identity
		want string
	}{
		{Config{}, Identity{Kind: KindHTTP, Model: "old", Dimension: 16}, "no embeddings endpoint"},
		{Config{}, Identity{Kind: KindHash, Model: "converge.hash.v0/128", Dimension: 128}, "not \"converge.hash.v0/128\""},
		{Config{}, Identity{Kind: "onnx", Model: "x", Dimension: 16}, `no embedder of kind "onnx"`},
		{Config{}, Identity{Kind: KindHash, Dimension: 16}, "incomplete"},
	} {
		if _, err := ForIdentity(tc.cfg, tc.id); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ForIdentity(%+v): %v; want an error with %q", tc.id, err, tc.want)
		}
	}
}

// The HTTP embedder against a real model, served locally: vectors of the
// configured dimension, unit length, and closer for texts of one meaning
// than for unrelated ones that share more words.
func TestHTTPAgainstALocalModel(t *testing.T) {
	url := embedtest.Start(t)
	for _, m := range []struct {
		model string
		dim   int
	}{{embedtest.Model256, 256}, {embedtest.Model128, 128}} {
		e, err := NewHTTP(HTTPConfig{URL: url, Model: m.model, Dimension: m.dim})
		if err != nil {
			t.Fatal(err)
		}
		vecs, err := e.Embed(context.Background(), []string{
			"The kitten is sleeping on the sofa.",
			"A young cat naps on the couch.",
			"The sofa is on sale at the furniture store today.",
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vecs {
			if len(v) != m.dim {
				t.Fatalf("%s: vector %d has %d dimensions", m.model, i, len(v))
			}
		}
		same, other := cosine(vecs[0], vecs[1]), cosine(vecs[0], vecs[2])
		t.Logf("%s: cosine of one meaning %.3f, of a shared word %.3f", m.model, same, other)
		if same <= other {
			t.Errorf("%s: texts of one meaning are no closer (%.3f) than texts sharing a word (%.3f)", m.model, same, other)
		}
	}
	// A model the server does not have is an error naming it.
	e, _ := NewHTTP(HTTPConfig{URL: url, Model: "no-such-model", Dimension: 8, MaxRetries: -1})
	if _, err := e.Embed(context.Background(), []string{"x"}); err == nil || !strings.Contains(err.Error(), "no-such-model") {
		t.Errorf("unknown model: %v", err)
	}
}
