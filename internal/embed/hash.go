// The package has two embedders: [Hash], a local feature-hashing embedding
// that is the default when no model is configured, and [HTTP], a client of an
// OpenAI-compatible embeddings endpoint. [New] picks one from a [Config].
//
// # Hash algorithm
//
// [Hash] vectors are a pure function of the text and the dimension d; they
// are named "converge.hash.v1/<d>". Any change to the steps below changes
// stored vectors, so it must come with a new name (and [HashVersion]).
//
//  1. Tokens. The text is decoded as UTF-8; an invalid byte decodes as U+FFFD.
//     A token is a maximal run of code points that are letters
//     ([unicode.IsLetter], category L) or decimal digits ([unicode.IsDigit],
//     category Nd); every other code point (spaces, punctuation, symbols,
//     marks, U+FFFD) separates tokens. Each code point of a token is mapped
//     with [unicode.ToLower] (simple case mapping), and the token's bytes are
//     the UTF-8 encoding of the result.
//  2. Features. Each token is a feature (a unigram), and so is each pair of
//     consecutive tokens a, b (a bigram), whatever separated them; the
//     bigram's bytes are a's bytes, one space (0x20), then b's bytes. A token
//     never contains a space, so a unigram and a bigram never share bytes.
//  3. Keys. A feature's key is the 64-bit FNV-1a hash of its bytes (offset
//     basis 14695981039346656037, prime 1099511628211, as [hash/fnv.New64a])
//     passed through the MurmurHash3 finaliser: h ^= h>>33;
//     h *= 0xff51afd7ed558ccd; h ^= h>>33; h *= 0xc4ceb9fe1a85ec53;
//     h ^= h>>33. The finaliser spreads FNV's weakly mixed low bits.
//  4. Index and sign. A key k maps to index ((k mod 2^32) * d) >> 32, in
//     [0, d), and to sign +1 when k < 2^63, -1 otherwise.
//  5. Weights. A feature occurring n times in the text (occurrences counted
//     by key) adds sign * (1 + ln n) to the entry at its index, once. Entries
//     are summed in float64.
//  6. Normalisation. The vector is multiplied by the reciprocal of its
//     Euclidean norm (in float64) and rounded to float32. A text without tokens, or whose contributions cancel out,
//     gets the unit vector with 1 at index 0.
//
// Texts that share words and word pairs therefore get a high cosine
// similarity; the embedding knows nothing of synonyms or meaning. Letter and
// digit classes and case mappings come from the Unicode tables of the Go
// release: a release with a newer Unicode version changes the vectors of texts
// holding code points whose class or case mapping changed (in practice, newly
// assigned ones). The work is linear in the text's length; scratch space is
// pooled, so the only allocations are the returned vectors.
package embed

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unicode"
	"unicode/utf8"
)

// HashVersion prefixes the [Hash.Name] of every hash embedder; it changes
// with any change to the algorithm in the package documentation.
const HashVersion = "converge.hash.v1"

// Limits and default of the hash dimension.
const (
	DefaultHashDimension = 256
	MinHashDimension     = 8
	MaxHashDimension     = 4096
)

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211

	// A pooled scratch space whose feature table grew beyond this is not
	// kept, so one huge text does not pin its memory.
	maxPooledSlots = 1 << 16
)

// Hash is the deterministic local embedder described in the package
// documentation. It is safe for concurrent use.
type Hash struct {
	dim     int
	name    string
	scratch sync.Pool // *hashScratch
}

var _ Embedder = (*Hash)(nil)

// NewHash returns a hash embedder of dim dimensions: [DefaultHashDimension]
// when dim is 0, otherwise between [MinHashDimension] and [MaxHashDimension].
func NewHash(dim int) (*Hash, error) {
	if dim == 0 {
		dim = DefaultHashDimension
	}
	if err := checkHashDimension(dim); err != nil {
		return nil, err
	}
	h := &Hash{dim: dim, name: fmt.Sprintf("%s/%d", HashVersion, dim)}
	h.scratch.New = func() any {
		s := &hashScratch{slots: make([]hashSlot, 1024), acc: make([]float64, dim)}
		for n := 1; n < len(s.weight); n++ {
			s.weight[n] = 1 + math.Log(float64(n))
		}
		return s
	}
	return h, nil
}

func checkHashDimension(dim int) error {
	if dim < MinHashDimension || dim > MaxHashDimension {
		return fmt.Errorf("embed: hash dimension %d is outside [%d, %d]", dim, MinHashDimension, MaxHashDimension)
	}
	return nil
}

// Name is "converge.hash.v1/<dimension>".
func (h *Hash) Name() string { return h.name }

// Dimension is the length of every vector.
func (h *Hash) Dimension() int { return h.dim }

// Embed returns one unit vector per text. It fails only when ctx ends.
func (h *Hash) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	// One backing array for all vectors; each vector's capacity ends at
	// its length so an append by the caller cannot overwrite the next.
	flat := make([]float32, len(texts)*h.dim)
	out := make([][]float32, len(texts))
	s := h.scratch.Get().(*hashScratch)
	defer h.release(s)
	for i, text := range texts {
		if i > 0 && i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("embed: %w", err)
			}
		}
		v := flat[i*h.dim : (i+1)*h.dim : (i+1)*h.dim]
		s.embed(text, v)
		out[i] = v
	}
	return out, nil
}

func (h *Hash) release(s *hashScratch) {
	if len(s.slots) > maxPooledSlots {
		return
	}
	h.scratch.Put(s)
}

// hashScratch is the per-call working space: an open-addressing table
// counting the occurrences of each feature key, the table's used slots in
// order of first occurrence, and the float64 sums.
type hashScratch struct {
	slots []hashSlot
	used  []uint32
	acc   []float64

	weight [64]float64 // weight[n] = 1 + ln n, the weight of n occurrences
}

type hashSlot struct {
	key uint64
	n   uint32 // occurrences; 0 is an empty slot
}

// embed writes the vector of text into v, len(v) == len(s.acc).
func (s *hashScratch) embed(text string, v []float32) {
	var (
		havePrev bool
		prev     uint64 // FNV-1a hash of the previous token
		buf      [utf8.UTFMax]byte
	)
	i := 0
	for i < len(text) {
		// One token per iteration: hash it as a unigram and, when there is
		// a previous token, as the tail of the bigram, in one pass.
		uni := uint64(fnvOffset64)
		bi := (prev ^ ' ') * fnvPrime64
		inToken := false
		for i < len(text) {
			c := text[i]
			if c < utf8.RuneSelf {
				i++
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				} else if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
					if inToken {
						break
					}
					continue
				}
				inToken = true
				uni = (uni ^ uint64(c)) * fnvPrime64
				bi = (bi ^ uint64(c)) * fnvPrime64
				continue
			}
			r, size := utf8.DecodeRuneInString(text[i:])
			i += size
			if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
				if inToken {
					break
				}
				continue
			}
			inToken = true
			n := utf8.EncodeRune(buf[:], unicode.ToLower(r))
			for _, b := range buf[:n] {
				uni = (uni ^ uint64(b)) * fnvPrime64
				bi = (bi ^ uint64(b)) * fnvPrime64
			}
		}
		if !inToken {
			break // only separators were left
		}
		s.add(fmix64(uni))
		if havePrev {
			s.add(fmix64(bi))
		}
		prev, havePrev = uni, true
	}
	s.finish(v)
}

// add counts one occurrence of the feature with key k.
func (s *hashScratch) add(k uint64) {
	if 2*(len(s.used)+1) > len(s.slots) {
		s.grow()
	}
	mask := uint32(len(s.slots) - 1)
	// The high bits pick the slot; the low bits pick the vector index, so
	// features sharing a probe sequence still spread over the vector.
	slot := uint32(k>>32) & mask
	for {
		e := &s.slots[slot]
		if e.n == 0 {
			e.key, e.n = k, 1
			s.used = append(s.used, slot)
			return
		}
		if e.key == k {
			e.n++
			return
		}
		slot = (slot + 1) & mask
	}
}

// grow doubles the table, which stays at most half full.
func (s *hashScratch) grow() {
	old := s.slots
	s.slots = make([]hashSlot, 2*len(old))
	mask := uint32(len(s.slots) - 1)
	for i, o := range s.used {
		e := old[o]
		slot := uint32(e.key>>32) & mask
		for s.slots[slot].n != 0 {
			slot = (slot + 1) & mask
		}
		s.slots[slot] = e
		s.used[i] = slot
	}
}

// finish weighs the counted features into v, normalises it and resets the
// scratch space for the next text.
func (s *hashScratch) finish(v []float32) {
	dim := uint64(len(s.acc))
	for _, slot := range s.used {
		e := &s.slots[slot]
		var w float64
		if int(e.n) < len(s.weight) {
			w = s.weight[e.n]
		} else {
			w = 1 + math.Log(float64(e.n))
		}
		if e.key>>63 != 0 {
			w = -w
		}
		s.acc[((e.key&math.MaxUint32)*dim)>>32] += w
		*e = hashSlot{}
	}
	s.used = s.used[:0]
	var sum float64
	for _, x := range s.acc {
		sum += x * x
	}
	if sum == 0 {
		clear(v)
		v[0] = 1
		return
	}
	scale := 1 / math.Sqrt(sum)
	v = v[:len(s.acc)]
	for i, x := range s.acc {
		v[i] = float32(x * scale)
	}
	clear(s.acc)
}

// fmix64 is the MurmurHash3 64-bit finaliser.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
