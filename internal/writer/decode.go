package writer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

// MaxRequestBytes bounds one document in a request or message: the
// largest body (contract.MaxBodyBytes) even when JSON escaping doubles it,
// plus the rest of the document.
const MaxRequestBytes = 2*contract.MaxBodyBytes + 2*contract.MaxMetaBytes + 1<<20

// wireDocument is a document as producers send it: in a PUT body (key
// optional, it comes from the path), as one NDJSON line of a batch, or as an
// ingest message. Withdrawn marks a withdrawal (batch and ingest only).
type wireDocument struct {
	Key       *string         `json:"key"`
	Version   json.RawMessage `json:"version"`
	Title     string          `json:"title"`
	Body      string          `json:"body"`
	Links     []string        `json:"links"`
	Tags      []string        `json:"tags"`
	Meta      json.RawMessage `json:"meta"`
	Withdrawn bool            `json:"withdrawn"`
}

func invalid(code, format string, args ...any) *contract.ValidationError {
	return &contract.ValidationError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// decodeWrite parses one JSON document. pathKey, when not empty, is the key
// from the URL; a key in the body must then match it. Errors are
// *contract.ValidationError.
func decodeWrite(data []byte, pathKey string, allowWithdraw bool) (docstore.Write, error) {
	if len(data) > MaxRequestBytes {
		return docstore.Write{}, &contract.ValidationError{Code: "request_too_large",
			Message: fmt.Sprintf("document is %d bytes, more than the limit of %d", len(data), MaxRequestBytes)}
	}
	if !utf8.Valid(data) {
		return docstore.Write{}, invalid(contract.CodeInvalidUTF8, "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w wireDocument
	if err := dec.Decode(&w); err != nil {
		return docstore.Write{}, invalid(contract.CodeInvalidJSON, "request body is not a valid JSON document: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return docstore.Write{}, invalid(contract.CodeInvalidJSON, "request body has data after the JSON document")
	}
	key := pathKey
	switch {
	case w.Key != nil && pathKey != "" && *w.Key != pathKey:
		return docstore.Write{}, invalid(contract.CodeKeyMismatch, "key %q in the body differs from key %q in the path", *w.Key, pathKey)
	case w.Key != nil:
		key = *w.Key
	}
	if key == "" {
		return docstore.Write{}, invalid(contract.CodeMissingKey, "key is missing")
	}
	version, err := parseVersion(w.Version)
	if err != nil {
		return docstore.Write{}, err
	}
	if w.Withdrawn {
		if !allowWithdraw {
			return docstore.Write{}, invalid(contract.CodeInvalidJSON, "withdrawn is not accepted here: use DELETE /v1/documents/{key}?version=N")
		}
		if w.Title != "" || w.Body != "" || len(w.Links) > 0 || len(w.Tags) > 0 || len(bytes.TrimSpace(w.Meta)) > 0 {
			return docstore.Write{}, invalid(contract.CodeInvalidJSON, "a withdrawal carries only key and version")
		}
	}
	return docstore.Write{
		Doc:      contract.Document{Key: key, Version: version, Title: w.Title, Body: w.Body, Links: w.Links, Tags: w.Tags, Meta: w.Meta},
		Withdraw: w.Withdrawn,
	}, nil
}

// parseVersion accepts a JSON integer; anything else names the problem.
func parseVersion(raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, invalid(contract.CodeMissingVersion, "version is missing: every write names the version it stores")
	}
	return parseVersionText(string(raw))
}

func parseVersionText(s string) (int64, error) {
	if s == "" {
		return 0, invalid(contract.CodeMissingVersion, "version is missing: every write names the version it stores")
	}
	v, ok := parseInteger(s)
	if !ok {
		return 0, invalid(contract.CodeInvalidVersion, "version must be an integer between 1 and %d, got %.40s", int64(1<<63-1), s)
	}
	if v <= 0 {
		return 0, invalid(contract.CodeInvalidVersion, "version must be greater than 0, got %d", v)
	}
	return v, nil
}

// jsonNumber is the grammar of a JSON number.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// parseInteger reads a JSON number whose value is an integer that fits
// an int64: 42, and also 42.0 or 4.2e1, since JSON (and JSON Schema's
// "integer") does not tell them apart.
func parseInteger(s string) (int64, bool) {
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, true
	}
	// No int64 takes more than 19 digits; the bounds keep big.Rat from
	// expanding an exponent of a billion.
	if len(s) > 64 || !jsonNumber.MatchString(s) {
		return 0, false
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		if exp, err := strconv.Atoi(s[i+1:]); err != nil || exp > 40 || exp < -40 {
			return 0, false
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok || !r.IsInt() || !r.Num().IsInt64() {
		return 0, false
	}
	return r.Num().Int64(), true
}
