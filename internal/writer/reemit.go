package writer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

// Limits of a re-emission request.
const (
	// DefaultReemitLimit is the page size of {"all":true} without a limit.
	DefaultReemitLimit = 500
	// MaxReemitKeys bounds the keys of one request, and its limit.
	MaxReemitKeys = 5000
	// maxReemitRequestBytes admits MaxReemitKeys keys of the longest size,
	// JSON-escaped.
	maxReemitRequestBytes = MaxReemitKeys*(6*contract.MaxKeyBytes+4) + 1<<10
)

// ReemitRequest is the body of POST /v1/admin/reemit: either Keys, or All
// with an optional After (exclusive) and Limit.
type ReemitRequest struct {
	Keys  []string `json:"keys,omitempty"`
	All   bool     `json:"all,omitempty"`
	After string   `json:"after,omitempty"`
	Limit int      `json:"limit,omitempty"`
}

// ReemitResponse is the answer of POST /v1/admin/reemit. Next is the After
// of the next page of {"all":true}, "" when no document is left.
type ReemitResponse struct {
	Reemitted []ReemittedDocument `json:"reemitted"`
	NotFound  []string            `json:"not_found"`
	Next      string              `json:"next"`
}

// ReemittedDocument is one document whose current version's event was
// written to the outbox again.
type ReemittedDocument struct {
	Key      string    `json:"key"`
	Version  int64     `json:"version"`
	EventID  uuid.UUID `json:"event_id"`
	Emission int64     `json:"emission"`
}

// decodeReemitRequest parses and checks a re-emission request. Errors are
// *contract.ValidationError.
func decodeReemitRequest(data []byte) (ReemitRequest, error) {
	if !utf8.Valid(data) {
		return ReemitRequest{}, invalid(contract.CodeInvalidUTF8, "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	// Each field raw: whether it was given, and null, is known without
	// decoding the body twice.
	var wire struct {
		Keys, All, After, Limit json.RawMessage
	}
	if err := dec.Decode(&wire); err != nil {
		return ReemitRequest{}, invalid(contract.CodeInvalidJSON, "request body is not a valid re-emission request: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ReemitRequest{}, invalid(contract.CodeInvalidJSON, "request body has data after the JSON object")
	}
	var req ReemitRequest
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		into any
		want string
	}{
		{"keys", wire.Keys, &req.Keys, "an array of keys"},
		{"all", wire.All, &req.All, "true or false"},
		{"after", wire.After, &req.After, "a string: the key to start after"},
	} {
		switch {
		case f.raw == nil:
		case string(f.raw) == "null":
			return ReemitRequest{}, invalid("invalid_request", "%q is null: give a value or leave it out", f.name)
		case json.Unmarshal(f.raw, f.into) != nil:
			return ReemitRequest{}, invalid(contract.CodeInvalidJSON, "%q must be %s", f.name, f.want)
		}
	}
	if wire.Limit != nil {
		n, ok := parseInteger(string(wire.Limit))
		if !ok || n < 1 || n > MaxReemitKeys {
			return ReemitRequest{}, invalid("invalid_limit", "limit must be an integer from 1 to %d, got %.40s", MaxReemitKeys, wire.Limit)
		}
		req.Limit = int(n)
	}
	switch {
	case wire.Keys != nil && (wire.All != nil || wire.After != nil || wire.Limit != nil):
		return ReemitRequest{}, invalid("invalid_request", `give either "keys" alone, or "all":true with "after" and "limit"`)
	case wire.Keys == nil && !req.All:
		return ReemitRequest{}, invalid("invalid_request", `give "keys":[...] or "all":true`)
	case len(req.Keys) > MaxReemitKeys:
		return ReemitRequest{}, invalid("too_many_keys", "%d keys, more than the limit of %d per request", len(req.Keys), MaxReemitKeys)
	}
	for _, k := range req.Keys {
		if err := contract.ValidateKey(k); err != nil {
			return ReemitRequest{}, err
		}
	}
	if req.All && req.Limit == 0 {
		req.Limit = DefaultReemitLimit
	}
	return req, nil
}

// reemit re-emits the documents of the request: see [docstore.Store.Reemit].
func (a *API) reemit(w http.ResponseWriter, r *http.Request) {
	if err := requireContentType(r, "application/json"); err != nil {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", err.Error())
		return
	}
	data, err := readBody(w, r, maxReemitRequestBytes)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	req, err := decodeReemitRequest(data)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	start := time.Now()
	var (
		res  docstore.Reemitted
		next string
	)
	if req.All {
		res, next, err = a.store.ReemitAll(r.Context(), req.After, req.Limit)
	} else {
		res, err = a.store.Reemit(r.Context(), req.Keys)
	}
	a.metrics.TxSeconds.WithLabelValues("reemit").Observe(time.Since(start).Seconds())
	if err != nil {
		if errors.Is(err, docstore.ErrNotReproducible) {
			a.log.ErrorContext(r.Context(), "re-emission refused", "err", err)
		}
		a.fail(w, r, err)
		return
	}
	a.metrics.Documents.WithLabelValues("reemit", "reemitted").Add(float64(len(res.Reemitted)))
	a.metrics.Documents.WithLabelValues("reemit", "not_found").Add(float64(len(res.NotFound)))
	out := ReemitResponse{Reemitted: make([]ReemittedDocument, len(res.Reemitted)), NotFound: res.NotFound, Next: next}
	if out.NotFound == nil {
		out.NotFound = []string{}
	}
	for i, d := range res.Reemitted {
		out.Reemitted[i] = ReemittedDocument{Key: d.Key, Version: d.Version, EventID: d.EventID, Emission: d.Emission}
	}
	writeJSON(w, http.StatusOK, out)
}

// notReproducibleMessage explains a refused re-emission to the client.
func notReproducibleMessage(err error) string {
	return fmt.Sprintf("%v; nothing was re-emitted (re-emit the other documents without this one)", err)
}
