package qdranttest

import "github.com/qdrant/go-client/qdrant"

// The server keeps the points of each value of the "key" payload field, as
// Qdrant's keyword payload index does, so that requests filtered on key
// look at those points only instead of the whole collection. Results do not
// depend on it: every candidate is still matched against the full filter.

// keyOf is a point's "key" payload value, if it is a string.
func keyOf(p *point) (string, bool) {
	v, ok := p.payload["key"]
	if !ok {
		return "", false
	}
	s, ok := v.GetKind().(*qdrant.Value_StringValue)
	if !ok {
		return "", false
	}
	return s.StringValue, true
}

// put stores p, replacing any point of the same id.
func (c *collection) put(p *point) {
	c.remove(p.id)
	c.points[p.id] = p
	if k, ok := keyOf(p); ok {
		if c.byKey == nil {
			c.byKey = make(map[string]map[pointID]*point)
		}
		m := c.byKey[k]
		if m == nil {
			m = make(map[pointID]*point)
			c.byKey[k] = m
		}
		m[p.id] = p
	}
}

// remove deletes the point of id, if any.
func (c *collection) remove(id pointID) {
	old, ok := c.points[id]
	if !ok {
		return
	}
	delete(c.points, id)
	if k, ok := keyOf(old); ok {
		if m := c.byKey[k]; m != nil {
			delete(m, id)
			if len(m) == 0 {
				delete(c.byKey, k)
			}
		}
	}
}

// candidates calls fn for every point that may match filter: the points of
// the keys a top-level must condition names, or all of them.
func (c *collection) candidates(filter *qdrant.Filter, fn func(*point)) {
	if keys, ok := mustKeys(filter); ok {
		for _, k := range keys {
			for _, p := range c.byKey[k] {
				fn(p)
			}
		}
		return
	}
	for _, p := range c.points {
		fn(p)
	}
}

// mustKeys returns keys that every point matching filter has one of: those
// of a top-level must condition matching the "key" field by keyword(s), or
// the union of those of every should clause (a point must match one).
func mustKeys(filter *qdrant.Filter) ([]string, bool) {
	if keys, ok := ownKeys(filter); ok {
		return keys, true
	}
	if len(filter.GetShould()) == 0 || filter.GetMinShould() != nil {
		return nil, false
	}
	var union []string
	for _, cond := range filter.GetShould() {
		keys, ok := ownKeys(cond.GetFilter())
		if !ok {
			return nil, false
		}
		union = append(union, keys...)
	}
	return distinctStrings(union), true
}

func ownKeys(filter *qdrant.Filter) ([]string, bool) {
	for _, cond := range filter.GetMust() {
		f := cond.GetField()
		if f == nil || f.GetKey() != "key" {
			continue
		}
		switch m := f.GetMatch().GetMatchValue().(type) {
		case *qdrant.Match_Keyword:
			return []string{m.Keyword}, true
		case *qdrant.Match_Keywords:
			return distinctStrings(m.Keywords.GetStrings()), true
		}
	}
	return nil, false
}

func distinctStrings(in []string) []string {
	seen := make(map[string]bool, len(in))
	out := in[:0:0]
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
