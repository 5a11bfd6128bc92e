package graph

import (
	"net/http"

	"github.com/converge-sync/converge/internal/httpjson"
)

// DocumentJSON is the answer of GET /v1/graph/{key}.
type DocumentJSON struct {
	Key         string      `json:"key"`
	Stub        bool        `json:"stub"`
	Version     int64       `json:"version"`
	Deleted     bool        `json:"deleted"`
	Title       string      `json:"title"`
	ContentHash string      `json:"content_hash"`
	Chunks      []ChunkJSON `json:"chunks"`
	LinksOut    []string    `json:"links_out"`
	LinksIn     []string    `json:"links_in"`
	Tags        []string    `json:"tags"`
}

// ChunkJSON is a chunk in [DocumentJSON].
type ChunkJSON struct {
	ID          string `json:"id"`
	Ordinal     int    `json:"ordinal"`
	ContentHash string `json:"content_hash"`
}

// ToJSON is v as served.
func ToJSON(v View) DocumentJSON {
	out := DocumentJSON{Key: v.Key, Stub: v.Stub, Version: v.Version, Deleted: v.Deleted, Title: v.Title,
		ContentHash: v.ContentHash, Chunks: []ChunkJSON{}, LinksOut: nonNil(v.Links), LinksIn: nonNil(v.LinkedBy), Tags: nonNil(v.Tags)}
	for _, c := range v.Chunks {
		out.Chunks = append(out.Chunks, ChunkJSON{ID: c.ID.String(), Ordinal: c.Ordinal, ContentHash: c.ContentHash})
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// DocumentHandler serves GET /v1/graph/{key}: what the graph holds about a
// document (404 when it has no node).
func DocumentHandler(b Backend) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if key == "" {
			httpjson.Error(w, http.StatusBadRequest, "missing_key", "a document key is required: /v1/graph/{key}")
			return
		}
		v, ok, err := b.Document(r.Context(), key)
		switch {
		case err != nil:
			httpjson.Error(w, http.StatusServiceUnavailable, "graph_unavailable", err.Error())
		case !ok:
			httpjson.Error(w, http.StatusNotFound, "not_found", "the graph has no document "+key)
		default:
			httpjson.Write(w, http.StatusOK, ToJSON(v))
		}
	})
}
