package neo4j

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/graph"
)

// decodeView reads a record of cypherView. Properties a node lacks (all
// but key on a stub) come back as nil and read as zero values.
func decodeView(rec record) (graph.View, error) {
	var v graph.View
	var err error
	field := func(name string, dst any) {
		if err != nil {
			return
		}
		err = decodeValue(rec[name], dst)
		if err != nil {
			err = fmt.Errorf("column %s: %w", name, err)
		}
	}
	var chunks []any
	field("key", &v.Key)
	field("version", &v.Version)
	field("deleted", &v.Deleted)
	field("title", &v.Title)
	field("content_hash", &v.ContentHash)
	field("stub", &v.Stub)
	field("chunks", &chunks)
	field("links", &v.Links)
	field("tags", &v.Tags)
	field("linked_by", &v.LinkedBy)
	if err != nil {
		return graph.View{}, err
	}
	if v.Key == "" {
		return graph.View{}, fmt.Errorf("a document without a key: %v", rec)
	}
	for _, raw := range chunks {
		c, err := decodeChunk(raw)
		if err != nil {
			return graph.View{}, fmt.Errorf("document %q: %w", v.Key, err)
		}
		v.Chunks = append(v.Chunks, c)
	}
	slices.SortFunc(v.Chunks, func(a, b graph.Chunk) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	slices.Sort(v.Links)
	slices.Sort(v.Tags)
	slices.Sort(v.LinkedBy)
	return v, nil
}

func decodeChunk(raw any) (graph.Chunk, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return graph.Chunk{}, fmt.Errorf("chunk %v is not a map", raw)
	}
	var id string
	var ordinal int64
	var c graph.Chunk
	for _, f := range []struct {
		name string
		dst  any
	}{{"id", &id}, {"ordinal", &ordinal}, {"content_hash", &c.ContentHash}} {
		if err := decodeValue(m[f.name], f.dst); err != nil {
			return graph.Chunk{}, fmt.Errorf("chunk %s: %w", f.name, err)
		}
	}
	parsed, err := uuid.Parse(id)
	if err != nil {
		return graph.Chunk{}, fmt.Errorf("chunk id %q: %w", id, err)
	}
	c.ID, c.Ordinal = parsed, int(ordinal)
	return c, nil
}

// decodeValue stores a value as the driver returns it (string, int64,
// bool, []any, or nil for a missing property) into dst.
func decodeValue(raw any, dst any) error {
	if raw == nil {
		return nil
	}
	var ok bool
	switch p := dst.(type) {
	case *string:
		*p, ok = raw.(string)
	case *int64:
		*p, ok = raw.(int64)
	case *bool:
		*p, ok = raw.(bool)
	case *[]any:
		*p, ok = raw.([]any)
	case *[]string:
		var list []any
		if list, ok = raw.([]any); ok {
			out := make([]string, 0, len(list))
			for _, item := range list {
				s, isString := item.(string)
				if !isString {
					return fmt.Errorf("%v (%T) in a list of strings", item, item)
				}
				out = append(out, s)
			}
			if len(out) > 0 {
				*p = out
			}
		}
	default:
		return fmt.Errorf("cannot decode into %T", dst)
	}
	if !ok {
		return fmt.Errorf("unexpected %T %v", raw, raw)
	}
	return nil
}

func sortViews(views []graph.View) {
	slices.SortFunc(views, func(a, b graph.View) int { return cmp.Compare(a.Key, b.Key) })
}
