package index

import (
	"context"
	"net/http"
	"strconv"

	"github.com/converge-sync/converge/internal/httpjson"
)

// SearchResult is one hit of GET /v1/search.
type SearchResult struct {
	Key     string   `json:"key"`
	Version int64    `json:"version"`
	Ordinal int      `json:"ordinal"`
	ChunkID string   `json:"chunk_id"`
	Title   string   `json:"title"`
	Tags    []string `json:"tags"`
	Score   float32  `json:"score"`
	Text    string   `json:"text"`
}

// MaxSearchK bounds k of a search request.
const MaxSearchK = 1000

// SearchHandler serves GET /v1/search?q=TEXT&k=N (k default 10) from x,
// an [Index]: the query is embedded with the index's own embedder, so
// results are only meaningful through the process that writes the index.
func SearchHandler(x interface {
	Search(ctx context.Context, text string, k int) ([]Hit, error)
}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("q")
		if q == "" {
			httpjson.Error(w, http.StatusBadRequest, "missing_query", "the query parameter q is required")
			return
		}
		k := 10
		if s := r.URL.Query().Get("k"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > MaxSearchK {
				httpjson.Error(w, http.StatusBadRequest, "invalid_k", "k must be an integer from 1 to "+strconv.Itoa(MaxSearchK))
				return
			}
			k = n
		}
		hits, err := x.Search(r.Context(), q, k)
		if err != nil {
			httpjson.Error(w, http.StatusServiceUnavailable, "search_failed", err.Error())
			return
		}
		out := struct {
			Results []SearchResult `json:"results"`
		}{Results: make([]SearchResult, len(hits))}
		for i, h := range hits {
			p := h.Point
			out.Results[i] = SearchResult{Key: p.Key, Version: p.Version, Ordinal: p.Ordinal, ChunkID: p.ID.String(),
				Title: p.Title, Tags: p.Tags, Score: h.Score, Text: p.Text}
		}
		httpjson.Write(w, http.StatusOK, out)
	})
}
