// Package latencytest is an OpenAI-compatible embeddings endpoint that
// answers each request after a fixed latency, as a remote model does
// (its round trip), with the hash embedder's vectors: for the benchmarks
// of a projector bound by its embedder's latency rather than its own CPU.
// It serves any number of requests at once, as a remote endpoint does;
// what bounds a client's throughput is the client's own concurrency.
package latencytest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/embed"
)

// Server is a running endpoint.
type Server struct {
	URL string // base URL: the embedder's -embed-url

	requests, texts atomic.Int64
	inFlight, peak  atomic.Int64
}

// Start starts an endpoint answering after latency with vectors of dim
// dimensions (any model name is accepted and echoed); it is stopped when
// t ends.
func Start(t testing.TB, latency time.Duration, dim int) *Server {
	t.Helper()
	h, err := embed.NewHash(dim)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string   `json:"model"`
			Input []string `json:"input"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.raisePeak(s.inFlight.Add(1))
		time.Sleep(latency)
		s.inFlight.Add(-1)
		s.requests.Add(1)
		s.texts.Add(int64(len(req.Input)))
		vecs, err := h.Embed(r.Context(), req.Input)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		type item struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		}
		out := struct {
			Model string `json:"model"`
			Data  []item `json:"data"`
		}{Model: req.Model}
		for i, v := range vecs {
			out.Data = append(out.Data, item{Index: i, Embedding: v})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// raisePeak records n requests in flight, if that is the most so far.
func (s *Server) raisePeak(n int64) {
	for p := s.peak.Load(); n > p; p = s.peak.Load() {
		if s.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// Requests is the number of requests answered so far.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Texts is the number of texts embedded so far (a text asked twice counts
// twice).
func (s *Server) Texts() int64 { return s.texts.Load() }

// PeakInFlight is the most requests it held at once so far.
func (s *Server) PeakInFlight() int64 { return s.peak.Load() }
