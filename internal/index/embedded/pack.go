package embedded

import (
	"fmt"
	"slices"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/textpack"
)

// The store keeps every point in memory for as long as it lives, so the
// number of objects it holds decides how long each garbage collection of
// its process spends marking them. A point as decoded from an event or a
// log record is nine objects or more (the struct, its key, hashes, title,
// text, tag slice and tags, vector); pack stores a document's points in
// four whatever their number: one slice of structs, one string holding all
// their text, one slice of tags and one of vector components.
//
// A document's points are written together and replaced together (a new
// version brings new IDs and removes the old ones), so sharing allocations
// within a document keeps no dead point's memory alive for long.

// pack copies points into the store's layout, a group of allocations for
// each run of consecutive points of one key, and returns pointers to the
// copies, in order. With normalise, vectors are stored at unit length (a
// write), which fails on a NaN or infinite component; without, they are
// copied as they are (a replay of vectors normalised when written), and
// pack cannot fail.
func pack(points []*index.Point, normalise bool) ([]*index.Point, error) {
	out := make([]*index.Point, 0, len(points))
	for len(points) > 0 {
		n := 1
		for n < len(points) && points[n].Key == points[0].Key {
			n++
		}
		var err error
		if out, err = packDocument(out, points[:n], normalise); err != nil {
			return nil, err
		}
		points = points[n:]
	}
	return out, nil
}

// packDocument packs points of one key and appends pointers to the
// copies to out. The key is stored once, and a title, content hash or tag
// list equal to the first point's is shared with it.
func packDocument(out, points []*index.Point, normalise bool) ([]*index.Point, error) {
	first := points[0]
	floats, tags := 0, len(first.Tags)
	for i, p := range points {
		floats += len(p.Vector)
		if i > 0 && !sameTags(p.Tags, first.Tags) {
			tags += len(p.Tags)
		}
	}
	slab := make([]index.Point, len(points))
	tagSlab := make([]string, 0, tags) // never grows: the pointers into it stay valid
	vectors := make([]float32, floats)
	// The strings to pack: each once, the shared ones from the first point.
	strs := make([]*string, 0, 3+4*len(points)+tags)
	addTags := func(ts []string) []string {
		if ts == nil {
			return nil
		}
		from := len(tagSlab)
		tagSlab = append(tagSlab, ts...)
		for i := from; i < len(tagSlab); i++ {
			strs = append(strs, &tagSlab[i])
		}
		return tagSlab[from:len(tagSlab):len(tagSlab)]
	}
	for i, p := range points {
		cp := &slab[i]
		*cp = index.Point{ID: p.ID, Version: p.Version, Ordinal: p.Ordinal, Key: p.Key, Title: p.Title,
			ContentHash: p.ContentHash, ChunkHash: p.ChunkHash, Text: p.Text}
		strs = append(strs, &cp.ChunkHash, &cp.Text)
		// Tags are shared as a slice, whose strings Pack rewrites in place.
		switch {
		case i == 0:
			strs = append(strs, &cp.Key, &cp.Title, &cp.ContentHash)
			cp.Tags = addTags(p.Tags)
		case sameTags(p.Tags, first.Tags):
			cp.Tags = slab[0].Tags
		default:
			cp.Tags = addTags(p.Tags)
		}
		if i > 0 && p.Title != first.Title {
			strs = append(strs, &cp.Title)
		}
		if i > 0 && p.ContentHash != first.ContentHash {
			strs = append(strs, &cp.ContentHash)
		}
		if len(p.Vector) > 0 {
			cp.Vector = vectors[:len(p.Vector):len(p.Vector)]
			vectors = vectors[len(p.Vector):]
			if !normalise {
				copy(cp.Vector, p.Vector)
			} else if err := normalizeInto(cp.Vector, p.Vector); err != nil {
				return nil, fmt.Errorf("embedded index: point %s: %w", p.ID, err)
			}
		}
	}
	textpack.Pack(strs)
	// The strings the other points share with the first, once packed.
	for i := range slab {
		cp := &slab[i]
		if i > 0 {
			cp.Key = slab[0].Key
			if cp.Title == first.Title {
				cp.Title = slab[0].Title
			}
			if cp.ContentHash == first.ContentHash {
				cp.ContentHash = slab[0].ContentHash
			}
		}
		out = append(out, cp)
	}
	return out, nil
}

// sameTags reports whether two tag lists are equal, nil and empty apart.
func sameTags(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// packMarker stores m's key and content hash in one string.
func packMarker(m index.Marker) index.Marker {
	both := m.Key + m.ContentHash
	m.Key, m.ContentHash = both[:len(m.Key)], both[len(m.Key):]
	return m
}
