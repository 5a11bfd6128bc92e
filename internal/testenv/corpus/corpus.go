package corpus

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/converge-sync/converge/pkg/contract"
)

// stream is the second word of the generator's PCG state: fixed, so that
// one seed names one corpus.
const stream = 20260818

// Op is one write of a corpus: an upsert of its Document, or, when
// Withdraw is set, a withdrawal of Key at Version (the content is empty).
type Op struct {
	contract.Document
	Withdraw bool
	// KeyInBody: a PUT also names the key in its body (it must match the
	// path). Loaders that send a key in every request ignore it.
	KeyInBody bool
}

// Kind is the kind of event the op writes.
func (o *Op) Kind() contract.Kind {
	if o.Withdraw {
		return contract.KindWithdrawn
	}
	return contract.KindUpserted
}

func (o *Op) String() string {
	if o.Withdraw {
		return fmt.Sprintf("withdraw %q@%d", o.Key, o.Version)
	}
	return fmt.Sprintf("upsert %q@%d", o.Key, o.Version)
}

// Corpus is a generated set of keys and their writes. Its ops are in
// version order per key: written in that order, every op applies.
type Corpus struct {
	Keys  []string         // generation order: SpecialKeys first
	ByKey map[string][]*Op // each key's ops in version order
	Ops   []*Op            // all ops, key by key, in version order
	Final map[string]*Op   // the highest version of each key

	byEvent map[event]*Op
}

type event struct {
	key     string
	version int64
	kind    contract.Kind
}

// Upserts counts the ops that are not withdrawals.
func (c *Corpus) Upserts() (n int) {
	for _, o := range c.Ops {
		if !o.Withdraw {
			n++
		}
	}
	return n
}

// Lookup returns the op that writes the event (key, version, kind), or nil
// when the corpus has none.
func (c *Corpus) Lookup(key string, version int64, kind contract.Kind) *Op {
	return c.byEvent[event{key, version, kind}]
}

// Generate returns the corpus of seed with at least keys keys: all of
// SpecialKeys, then generated ones (paths, spaces, percent signs, query
// strings, several scripts). Each key gets one to four upserts, in
// versions that mostly step by 1 to 3 and sometimes jump; about one key in
// ten ends withdrawn, a few are withdrawn and upserted again, and one in a
// hundred is only ever withdrawn. One upsert in twenty repeats the previous
// version's content; links point at keys of the corpus, sometimes at the
// key itself, twice. Every op is valid for contract.Document.Normalize.
func Generate(seed uint64, keys int) *Corpus {
	rng := rand.New(rand.NewPCG(seed, stream)) //nolint:gosec // a reproducible corpus, not a secret
	c := &Corpus{ByKey: map[string][]*Op{}, Final: map[string]*Op{}, byEvent: map[event]*Op{}}
	seen := map[string]bool{}
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			c.Keys = append(c.Keys, k)
		}
	}
	for _, k := range SpecialKeys {
		add(k)
	}
	for i := 0; len(c.Keys) < keys; i++ {
		w := pick(rng, words)
		switch rng.IntN(8) {
		case 0:
			add(fmt.Sprintf("docs/%s/%s-%d.md", pick(rng, sections), w, i))
		case 1:
			add(fmt.Sprintf("notes/%s %s %d", w, pick(rng, words), i))
		case 2:
			add(fmt.Sprintf("wiki/%s/%s_%d", pick(rng, uniWords), w, i))
		case 3:
			add(fmt.Sprintf("kb/%d/%s.%s.v%d", i, w, pick(rng, words), rng.IntN(9)))
		case 4:
			add(fmt.Sprintf("search?q=%s&page=%d", w, i))
		case 5:
			add(fmt.Sprintf("pct/%d%%-%s", i, w))
		default:
			add(fmt.Sprintf("%s-%d", w, i))
		}
	}
	for _, k := range c.Keys {
		c.addKey(rng, k)
	}
	return c
}

// addKey generates the ops of key k.
func (c *Corpus) addKey(rng *rand.Rand, k string) {
	// The sequence of kinds: 'u' upsert, 'w' withdrawal.
	ups := 1 + rng.IntN(4)
	var kinds string
	switch p := rng.IntN(100); {
	case p < 10: // ends withdrawn
		kinds = strings.Repeat("u", ups) + "w"
	case p < 13: // withdrawn, then upserted again
		ups = max(ups, 2)
		cut := 1 + rng.IntN(ups-1)
		kinds = strings.Repeat("u", cut) + "w" + strings.Repeat("u", ups-cut)
	case p < 14: // withdrawn without ever being upserted
		kinds = "w"
	default:
		kinds = strings.Repeat("u", ups)
	}
	var versions []int64
	v := int64(1 + rng.IntN(3))
	if rng.IntN(50) == 0 || k == "big/version" {
		v = 1<<53 + rng.Int64N(1000) // beyond float64 precision
	}
	for range kinds {
		versions = append(versions, v)
		if rng.IntN(10) == 0 {
			v += 100 + rng.Int64N(1000)
		} else {
			v += 1 + rng.Int64N(3)
		}
	}
	if k == "max/version" {
		kinds, versions = "uuw", []int64{5, math.MaxInt64 - 1, math.MaxInt64}
	}
	var prev *Op
	for i, kc := range kinds {
		o := &Op{Document: contract.Document{Key: k, Version: versions[i]}, Withdraw: kc == 'w'}
		if !o.Withdraw {
			if prev != nil && rng.IntN(20) == 0 {
				// A new version with the same content.
				o.Title, o.Body, o.Links, o.Tags, o.Meta = prev.Title, prev.Body, prev.Links, prev.Tags, prev.Meta
			} else {
				o.Title, o.Body, o.Meta = title(rng), body(rng), meta(rng)
				for range rng.IntN(6) {
					o.Links = append(o.Links, pick(rng, c.Keys))
				}
				if rng.IntN(10) == 0 {
					o.Links = append(o.Links, k, k) // self-link, duplicated
				}
				for range rng.IntN(6) {
					o.Tags = append(o.Tags, pick(rng, tagVocab))
				}
			}
			o.KeyInBody = rng.IntN(3) == 0
			prev = o
		}
		c.ByKey[k] = append(c.ByKey[k], o)
		c.Ops = append(c.Ops, o)
		c.byEvent[event{o.Key, o.Version, o.Kind()}] = o
	}
	c.Final[k] = c.ByKey[k][len(c.ByKey[k])-1]
}
