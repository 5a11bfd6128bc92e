package index

import (
	"net/http"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/httpjson"
)

// InfoPath is the index projector's route that describes its live
// generation.
const InfoPath = "/v1/index"

// Info is the answer of GET /v1/index: the live generation and the
// embedders.
type Info struct {
	Generation string `json:"generation"`
	// Embedder made the generation's vectors; Configured is the
	// projector's. When they differ, WritesRefused says why the
	// generation is not written and what to do (a rebuild), and
	// SearchError, if set, why searches are not answered either.
	Embedder      embed.Identity `json:"embedder"`
	Configured    embed.Identity `json:"configured"`
	WritesRefused string         `json:"writes_refused,omitempty"`
	SearchError   string         `json:"search_error,omitempty"`
}

// InfoHandler serves GET /v1/index for the generation called name.
func InfoHandler(name string, x *Index) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		stored, configured, refusing := x.Embedder()
		info := Info{Generation: name, Embedder: stored, Configured: configured}
		if refusing != nil {
			info.WritesRefused = refusing.Error()
		}
		if err := x.SearchError(); err != nil {
			info.SearchError = err.Error()
		}
		httpjson.Write(w, http.StatusOK, info)
	})
}
