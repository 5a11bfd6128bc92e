package embed

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
)

// referenceHash is the algorithm of the package documentation written as
// plainly as possible, without the streaming, pooling and fast paths of
// [Hash].
func referenceHash(text string, dim int) []float32 {
	tokens := strings.FieldsFunc(text, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	var features []string
	for i, tok := range tokens {
		tokens[i] = strings.Map(unicode.ToLower, tok)
		features = append(features, tokens[i])
		if i > 0 {
			features = append(features, tokens[i-1]+" "+tokens[i])
		}
	}
	counts := map[uint64]int{}
	var order []uint64
	for _, f := range features {
		h := fnv.New64a()
		h.Write([]byte(f))
		k := h.Sum64()
		k ^= k >> 33
		k *= 0xff51afd7ed558ccd
		k ^= k >> 33
		k *= 0xc4ceb9fe1a85ec53
		k ^= k >> 33
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	acc := make([]float64, dim)
	for _, k := range order {
		w := 1 + math.Log(float64(counts[k]))
		if k >= 1<<63 {
			w = -w
		}
		acc[(k%(1<<32))*uint64(dim)>>32] += w
	}
	var sum float64
	for _, x := range acc {
		sum += x * x
	}
	v := make([]float32, dim)
	if sum == 0 {
		v[0] = 1
		return v
	}
	for i, x := range acc {
		v[i] = float32(x * (1 / math.Sqrt(sum)))
	}
	return v
}

func mustHash(t testing.TB, dim int) *Hash {
	t.Helper()
	h, err := NewHash(dim)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func embedOne(t testing.TB, e Embedder, text string) []float32 {
	t.Helper()
	vs, err := e.Embed(context.Background(), []string{text})
	if err != nil {
		t.Fatal(err)
	}
	return vs[0]
}

func closeTo(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i])-float64(b[i])) > tol {
			return false
		}
	}
	return true
}

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func cosine(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s / (norm(a) * norm(b))
}

// TestHashKnownAnswer pins the vectors of HashVersion. If it fails, the
// algorithm changed: stored vectors change with it, so bump HashVersion
// together with the expected values below.
func TestHashKnownAnswer(t *testing.T) {
	if HashVersion != "converge.hash.v1" {
		t.Fatalf("HashVersion = %q; update the expected vectors with it", HashVersion)
	}

	// The published FNV-1a 64 test vector of "a", and the keys derived from
	// it and from the other features of "A b, a!".
	h := fnv.New64a()
	h.Write([]byte("a"))
	if got := h.Sum64(); got != 0xaf63dc4c8601ec8c {
		t.Fatalf("FNV-1a(a) = %#x", got)
	}
	keys := map[string]uint64{
		"a":   0x82a2a958a9bece5b,
		"b":   0x6e673288764ad2d0,
		"a b": 0x53ca607c98c45326,
		"b a": 0xc1125644222bf4ec,
	}
	for f, want := range keys {
		h := fnv.New64a()
		h.Write([]byte(f))
		if got := fmix64(h.Sum64()); got != want {
			t.Errorf("key(%q) = %#x, want %#x", f, got, want)
		}
	}

	// "A b, a!" has the tokens a, b, a: unigram a twice, b once, bigrams
	// "a b" and "b a" once. At dimension 256 the keys above give the
	// indices ((k mod 2^32) * 256) >> 32 = the top byte of the low 32 bits:
	// a 0xa9 = 169, b 0x76 = 118, "a b" 0x98 = 152, "b a" 0x22 = 34; the
	// keys of a and "b a" have the top bit set, so their sign is -1. The
	// weights are 1 + ln 2 for a and 1 for the others, and the norm is
	// sqrt((1 + ln 2)^2 + 3).
	n := math.Sqrt((1+math.Ln2)*(1+math.Ln2) + 3)
	want := make([]float32, 256)
	want[169] = float32(-(1 + math.Ln2) / n) // -0.69903
	want[118] = float32(1 / n)               // 0.41286
	want[152] = float32(1 / n)
	want[34] = float32(-1 / n)
	if got := embedOne(t, mustHash(t, 256), "A b, a!"); !closeTo(got, want, 1e-7) {
		t.Errorf("vector of %q:\n got %v\nwant %v", "A b, a!", got, want)
	}

	for _, tc := range []struct {
		dim  int
		text string
		want []float32
	}{
		{16, "Converge keeps the index in agreement with PostgreSQL; Converge keeps it fresh.", []float32{
			0.21516454, 0.43032908, 0.21516454, 0.21516454, 0, 0.57946974, -0.21516454, 0,
			-0.21516454, 0.36430523, 0, -0.21516454, 0.21516454, -0.14914069, 0, 0,
		}},
		{8, "Straße, ÉCOLE — 日本語テキスト ٣٤ straße", []float32{
			0, 0.7130704, 0, 0.3565352, 0, 0.60366654, 0, 0,
		}},
	} {
		if got := embedOne(t, mustHash(t, tc.dim), tc.text); !closeTo(got, tc.want, 1e-7) {
			t.Errorf("vector of %q at dimension %d:\n got %#v\nwant %#v", tc.text, tc.dim, got, tc.want)
		}
	}
}

func TestHashMatchesReference(t *testing.T) {
	texts := []string{
		"",
		"a",
		"Hello, World! hello world",
		"The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
		"x1 x2 x1 x2 x1 x2 x1 x2",
		"Straße ÉCOLE İstanbul ΣΊΣΥΦΟΣ 日本語テキスト ٣٤ ½ Ⅻ",
		"caf\u00e9 cafe\u0301",
		"bad \xff\xfe utf8 \xe2\x82 tail",
		"tabs\tand\nnewlines\r\nand\u00a0nbsp",
		strings.Repeat("repeat ", 5000),
	}
	rng := rand.New(rand.NewPCG(7, 11))
	alphabet := []rune("aAbBzZ09 .,-\n\tßÉé日本\u0301\u00a0٣😀\uFFFD")
	for range 200 {
		r := make([]rune, rng.IntN(80))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		texts = append(texts, string(r))
	}
	texts = append(texts, genText(rand.New(rand.NewPCG(1, 2)), 64<<10))
	for _, dim := range []int{8, 17, 256, 4096} {
		h := mustHash(t, dim)
		got, err := h.Embed(context.Background(), texts)
		if err != nil {
			t.Fatal(err)
		}
		for i, text := range texts {
			if want := referenceHash(text, dim); !closeTo(got[i], want, 1e-6) {
				t.Errorf("dim %d, text %.40q: differs from the reference", dim, text)
			}
		}
	}
}

func FuzzHashMatchesReference(f *testing.F) {
	f.Add("Hello, World! hello world")
	f.Add("Straße ÉCOLE 日本語 ٣٤ caf\u00e9 cafe\u0301")
	f.Add("bad \xff\xfe utf8")
	f.Add("")
	h := mustHash(f, 16)
	f.Fuzz(func(t *testing.T, text string) {
		got := embedOne(t, h, text)
		if want := referenceHash(text, 16); !closeTo(got, want, 1e-6) {
			t.Fatalf("%q: got %v, want %v", text, got, want)
		}
		if n := norm(got); math.Abs(n-1) > 1e-5 {
			t.Fatalf("%q: norm %v", text, n)
		}
	})
}

func TestNewHashDimension(t *testing.T) {
	for _, tc := range []struct {
		dim, want int
		ok        bool
	}{
		{0, 256, true}, {8, 8, true}, {300, 300, true}, {4096, 4096, true},
		{7, 0, false}, {4097, 0, false}, {-1, 0, false},
	} {
		h, err := NewHash(tc.dim)
		if (err == nil) != tc.ok {
			t.Errorf("NewHash(%d): error %v, want ok=%v", tc.dim, err, tc.ok)
			continue
		}
		if !tc.ok {
			continue
		}
		if h.Dimension() != tc.want || h.Name() != fmt.Sprintf("converge.hash.v1/%d", tc.want) {
			t.Errorf("NewHash(%d): dimension %d, name %q", tc.dim, h.Dimension(), h.Name())
		}
		if v := embedOne(t, h, "some text"); len(v) != tc.want {
			t.Errorf("NewHash(%d): vector of length %d", tc.dim, len(v))
		}
	}
}

func TestHashDeterministic(t *testing.T) {
	text := genText(rand.New(rand.NewPCG(3, 4)), 4096)
	a := embedOne(t, mustHash(t, 256), text)
	h := mustHash(t, 256)
	// Scratch space reused after other texts must not leak into the next.
	if _, err := h.Embed(context.Background(), []string{"other words entirely", genText(rand.New(rand.NewPCG(5, 6)), 200<<10)}); err != nil {
		t.Fatal(err)
	}
	b := embedOne(t, h, text)
	if !slices.Equal(a, b) {
		t.Fatal("the same text gave two vectors")
	}
}

func TestHashNormalised(t *testing.T) {
	h := mustHash(t, 64)
	rng := rand.New(rand.NewPCG(8, 9))
	texts := []string{"a", "a a a a", "Hello, World!", "日本語", genText(rng, 1024), genText(rng, 1<<20)}
	vs, err := h.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if n := norm(v); math.Abs(n-1) > 1e-5 {
			t.Errorf("text %d: norm %v", i, n)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Errorf("text %d: entry %v", i, x)
			}
		}
	}
}

func TestHashCaseAndSeparators(t *testing.T) {
	h := mustHash(t, 256)
	same := [][2]string{
		{"Hello World", "hello world"},
		{"hello, world!", "  hello\n\tworld...  "},
		{"STRASSE Straße", "strasse straße"},
		{"ÉCOLE", "école"},
		{"x\xffy", "x y"},
	}
	for _, p := range same {
		if !slices.Equal(embedOne(t, h, p[0]), embedOne(t, h, p[1])) {
			t.Errorf("%q and %q differ", p[0], p[1])
		}
	}
	differ := [][2]string{
		{"hello world", "world hello"}, // same unigrams, other bigrams
		{"helloworld", "hello world"},
		{"ab", "a b"},
	}
	for _, p := range differ {
		if slices.Equal(embedOne(t, h, p[0]), embedOne(t, h, p[1])) {
			t.Errorf("%q and %q have the same vector", p[0], p[1])
		}
	}
}

func TestHashSimilarity(t *testing.T) {
	h := mustHash(t, 256)
	texts := []string{
		"The relay publishes outbox events to JetStream and confirms the replication slot position.",
		"The relay publishes outbox events to NATS JetStream, then confirms the slot position.",
		"Bake the bread for forty minutes until the crust is golden brown.",
	}
	vs, err := h.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	similar, unrelated := cosine(vs[0], vs[1]), cosine(vs[0], vs[2])
	t.Logf("similar %.3f, unrelated %.3f", similar, unrelated)
	if similar < 0.5 || unrelated > 0.3 || similar < unrelated+0.3 {
		t.Errorf("cosine of similar texts %.3f, of unrelated texts %.3f", similar, unrelated)
	}
}

func TestHashEmptyText(t *testing.T) {
	h := mustHash(t, 32)
	want := make([]float32, 32)
	want[0] = 1
	for _, text := range []string{"", " ", "!?.,;:", "\xff\xfe", "— … ✓ 😀"} {
		if got := embedOne(t, h, text); !slices.Equal(got, want) {
			t.Errorf("%q: %v", text, got)
		}
	}
}

func TestHashVectorsDoNotAlias(t *testing.T) {
	h := mustHash(t, 8)
	vs, err := h.Embed(context.Background(), []string{"one", "two"})
	if err != nil {
		t.Fatal(err)
	}
	second := slices.Clone(vs[1])
	_ = append(vs[0], 42)
	if !slices.Equal(vs[1], second) {
		t.Fatal("appending to one vector changed the next")
	}
}

func TestHashContext(t *testing.T) {
	h := mustHash(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.Embed(ctx, []string{"x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if vs, err := h.Embed(context.Background(), nil); err != nil || len(vs) != 0 {
		t.Fatalf("no texts: %v, %v", vs, err)
	}
}

func TestHashConcurrent(t *testing.T) {
	h := mustHash(t, 128)
	rng := rand.New(rand.NewPCG(10, 11))
	texts := make([]string, 50)
	for i := range texts {
		texts[i] = genText(rng, 10+rng.IntN(5000))
	}
	want, err := h.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range texts {
				j := (i + g*7) % len(texts)
				got, err := h.Embed(context.Background(), texts[j:j+1])
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.Equal(got[0], want[j]) {
					t.Errorf("goroutine %d, text %d: another vector", g, j)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestHashAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	h := mustHash(t, 256)
	texts := []string{genText(rand.New(rand.NewPCG(1, 1)), 1024)}
	embedOne(t, h, texts[0]) // fill the pool
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := h.Embed(context.Background(), texts); err != nil {
			t.Fatal(err)
		}
	})
	// The backing array of the vectors and the slice of vectors.
	if allocs > 2 {
		t.Errorf("%v allocations per call, want 2", allocs)
	}
}

// BenchmarkHash embeds one 1 KiB chunk per operation.
func BenchmarkHash(b *testing.B) {
	for _, tc := range []struct {
		name string
		text string
	}{
		{"english-1KiB", genText(rand.New(rand.NewPCG(1, 2)), 1024)},
		{"mixed-1KiB", genMixedText(rand.New(rand.NewPCG(1, 2)), 1024)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := mustHash(b, 256)
			texts := []string{tc.text}
			b.SetBytes(int64(len(tc.text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.Embed(context.Background(), texts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var words = strings.Fields(`the a of to and in is for that with on as by this from converge index
	vector document chunk version relay outbox replication slot postgres jetstream stream consumer
	embedding search query score cosine similarity freshness marker delete upsert batch retry
	backoff timeout server client request response error status model dimension hash feature`)

// genText is about n bytes of English-like prose: words, punctuation,
// capitals and line breaks.
func genText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		w := words[rng.IntN(len(words))]
		if rng.IntN(8) == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		b.WriteString(w)
		switch rng.IntN(12) {
		case 0:
			b.WriteString(". ")
		case 1:
			b.WriteString(", ")
		case 2:
			b.WriteString("\n")
		default:
			b.WriteString(" ")
		}
	}
	return b.String()[:n]
}

// genMixedText is about n bytes of prose mixing Latin, accented, Greek and
// Japanese words.
func genMixedText(rng *rand.Rand, n int) string {
	mixed := append(slices.Clone(words), "straße", "école", "größe", "λόγος", "δεδομένα", "日本語", "検索", "ベクトル", "データ")
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(mixed[rng.IntN(len(mixed))])
		b.WriteString(" ")
	}
	return b.String()
}
