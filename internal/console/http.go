package console

import (
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/httpjson"
)

// The console's API, which the page polls.
const (
	AccessPath  = "/v1/console/access"
	ReadingPath = "/v1/console/reading"
	// RedrivePath is POSTed with a [RedriveRequest]; {consumer} is the
	// dead letters' consumer.
	RedrivePath = "/v1/console/deadletters/{consumer}/redrive"
)

//go:embed page
var page embed.FS

// Access is what a token may do: GET /v1/console/access.
type Access struct {
	// TokenName is the token's name in the tokens file ("" with
	// authentication off).
	TokenName string `json:"token_name"`
	Read      bool   `json:"read"`
	Admin     bool   `json:"admin"`
	// RefreshMillis is how often the page polls: the console's interval.
	RefreshMillis int64 `json:"refresh_ms"`
}

// RedriveRequest selects the dead letters of a consumer to redrive.
type RedriveRequest struct {
	Seqs []uint64 `json:"seqs"`
	All  bool     `json:"all"`
}

// RedriveResult is the answer to a redrive: how many were redriven and
// deleted, each one redriven or kept, and the error that stopped it.
type RedriveResult struct {
	Redriven int                   `json:"redriven"`
	Results  []deadletter.Redriven `json:"results"`
	Error    string                `json:"error,omitempty"`
}

// Handler serves the page at / and the API: reads need the read scope, a
// redrive the admin scope.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, err := fs.Sub(page, "page")
	if err != nil {
		panic(err) // the embedded directory is there
	}
	files := http.FileServerFS(static)
	mux.Handle("GET /", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The page holds no data; a strict policy keeps what it shows
		// from running as script.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		files.ServeHTTP(w, r)
	}))
	mux.Handle("GET "+AccessPath, c.guard.Require(auth.Read|auth.Admin, http.HandlerFunc(c.serveAccess)))
	mux.Handle("GET "+ReadingPath, c.guard.Require(auth.Read, http.HandlerFunc(c.serveReading)))
	mux.Handle("POST "+RedrivePath, c.guard.Require(auth.Admin, http.HandlerFunc(c.serveRedrive)))
	return mux
}

func (c *Console) serveAccess(w http.ResponseWriter, r *http.Request) {
	a := Access{TokenName: auth.Name(r.Context()), Read: true, Admin: true, RefreshMillis: c.cfg.Interval.Milliseconds()}
	if c.guard.Enabled() {
		a.Read = c.guard.Allows(r, auth.Read)
		a.Admin = c.guard.Allows(r, auth.Admin)
	}
	httpjson.Write(w, http.StatusOK, a)
}

func (c *Console) serveReading(w http.ResponseWriter, _ *http.Request) {
	rd, err := c.Last()
	if err != nil {
		httpjson.Error(w, http.StatusServiceUnavailable, "not_read_yet", err.Error())
		return
	}
	httpjson.Write(w, http.StatusOK, rd)
}

func (c *Console) serveRedrive(w http.ResponseWriter, r *http.Request) {
	consumer := r.PathValue("consumer")
	var req RedriveRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpjson.Error(w, http.StatusBadRequest, "invalid_request", "the body must be {\"seqs\":[N,...]} or {\"all\":true}: "+err.Error())
		return
	}
	if (len(req.Seqs) == 0) == !req.All {
		httpjson.Error(w, http.StatusBadRequest, "invalid_request", "give the dead letters' sequences (seqs) or all, not both")
		return
	}
	c.redrive.Lock()
	defer c.redrive.Unlock()
	q, err := deadletter.Open(r.Context(), c.cfg.JS)
	if err != nil {
		httpjson.Error(w, http.StatusBadGateway, "nats_unavailable", err.Error())
		return
	}
	res := RedriveResult{Results: []deadletter.Redriven{}}
	res.Redriven, err = q.Redrive(r.Context(), deadletter.Redrive{Consumer: consumer, Seqs: req.Seqs, All: req.All, Writer: c.cfg.Reemitter},
		func(d deadletter.Redriven) { res.Results = append(res.Results, d) })
	c.readAgain()
	c.cfg.Log.Info("dead letters redriven", "consumer", consumer, "redriven", res.Redriven, "seqs", req.Seqs, "all", req.All,
		"token_name", auth.Name(r.Context()), "error", err)
	status := http.StatusOK
	if err != nil {
		res.Error = err.Error()
		status = http.StatusConflict
		var unknown *deadletter.UnknownConsumerError
		if errors.As(err, &unknown) {
			status = http.StatusNotFound
		}
	}
	httpjson.Write(w, status, res)
}
