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
	size, floats, tags := len(first.Key)+len(first.Title)+len(first.ContentHash), 0, len(first.Tags)
	for _, t := range first.Tags {
		size += len(t)
	}
	for i, p := range points {
		size += len(p.ChunkHash) + len(p.Text)
		floats += len(p.Vector)
		if i == 0 {
			continue
		}
		if p.Title != first.Title {
			size += len(p.Title)
		}
		if p.ContentHash != first.ContentHash {
			size += len(p.ContentHash)
		}
		if !sameTags(p.Tags, first.Tags) {
			tags += len(p.Tags)
			for _, t := range p.Tags {
				size += len(t)
			}
		}
	}

	var text textpack.Builder
	text.Grow(size)
	put := text.Put
	// Offsets first, strings after: the text is one string only once
	// complete.
	spans := make([]textpack.Span, 0, 3+len(first.Tags)+2*len(points))
	key, title, hash := put(first.Key), put(first.Title), put(first.ContentHash)
	for _, t := range first.Tags {
		spans = append(spans, put(t))
	}
	firstTags := len(spans)
	type pointSpans struct {
		chunkHash, text, title, hash textpack.Span
		tags                         []textpack.Span
		ownTags                      bool
	}
	ps := make([]pointSpans, len(points))
	for i, p := range points {
		ps[i].chunkHash, ps[i].text = put(p.ChunkHash), put(p.Text)
		ps[i].title, ps[i].hash = title, hash
		if p.Title != first.Title {
			ps[i].title = put(p.Title)
		}
		if p.ContentHash != first.ContentHash {
			ps[i].hash = put(p.ContentHash)
		}
		if i > 0 && !sameTags(p.Tags, first.Tags) {
			ps[i].ownTags = true
			for _, t := range p.Tags {
				ps[i].tags = append(ps[i].tags, put(t))
			}
		}
	}
	str := text.Text()

	tagSlab := make([]string, 0, tags)
	for _, s := range spans[:firstTags] {
		tagSlab = append(tagSlab, str(s))
	}
	sharedTags := tagSlab[:len(first.Tags):len(first.Tags)]
	if first.Tags == nil {
		sharedTags = nil
	}
	vectors := make([]float32, floats)
	slab := make([]index.Point, len(points))
	for i, p := range points {
		cp := &slab[i]
		cp.ID, cp.Version, cp.Ordinal = p.ID, p.Version, p.Ordinal
		cp.Key, cp.Title, cp.ContentHash = str(key), str(ps[i].title), str(ps[i].hash)
		cp.ChunkHash, cp.Text = str(ps[i].chunkHash), str(ps[i].text)
		cp.Tags = sharedTags
		if ps[i].ownTags {
			from := len(tagSlab)
			for _, s := range ps[i].tags {
				tagSlab = append(tagSlab, str(s))
			}
			cp.Tags = tagSlab[from:len(tagSlab):len(tagSlab)]
			if p.Tags == nil {
				cp.Tags = nil
			}
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
