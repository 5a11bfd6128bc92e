package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Codes of the writer's error answers (api/openapi.json lists each with
// the answers that carry it). Those of a document's fields are the
// contract's, [contract.CodeInvalidJSON] and the rest, repeated here so
// that one list has them all.
const (
	CodeInvalidJSON          = "invalid_json"
	CodeInvalidUTF8          = "invalid_utf8"
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = "forbidden"
	CodeNotFound             = "not_found"
	CodeVersionConflict      = "version_conflict"
	CodeRequestTooLarge      = "request_too_large"
	CodeBodyTooLarge         = "body_too_large"
	CodeMetaTooLarge         = "meta_too_large"
	CodeTooManyLinks         = "too_many_links"
	CodeTooManyTags          = "too_many_tags"
	CodeTitleTooLong         = "title_too_long"
	CodeEventTooLarge        = "event_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeMissingKey           = "missing_key"
	CodeKeyTooLong           = "key_too_long"
	CodeKeyControlChar       = "key_control_character"
	CodeKeyMismatch          = "key_mismatch"
	CodeMissingVersion       = "missing_version"
	CodeInvalidVersion       = "invalid_version"
	CodeInvalidMeta          = "invalid_meta"
	CodeInvalidLink          = "invalid_link"
	CodeInvalidTag           = "invalid_tag"
	CodeNULCharacter         = "nul_character"
	CodeRejectedValue        = "rejected_value"
	CodeInvalidRequest       = "invalid_request"
	CodeTooManyKeys          = "too_many_keys"
	CodeInvalidLimit         = "invalid_limit"
	CodeNotReproducible      = "not_reproducible"
	CodeStoreUnavailable     = "store_unavailable"
	CodeUnavailable          = "unavailable"
)

// Classes of error answers, matched with errors.Is on an [*Error].
var (
	// ErrInvalid: the writer refused the request itself (400, 413, 415,
	// 422): sending it again changes nothing.
	ErrInvalid = errors.New("client: the writer refused the request as invalid")
	// ErrTooLarge: the request or a part of the document is over its
	// limit (413); also an ErrInvalid.
	ErrTooLarge = errors.New("client: over a limit of the writer")
	// ErrVersionConflict: this version is already stored with other
	// content (409). Never resolved by overwriting: write a new version.
	ErrVersionConflict = errors.New("client: version conflict")
	// ErrNotFound: no version of the key was ever written (404).
	ErrNotFound = errors.New("client: document not found")
	// ErrUnauthorized: no token, or one the writer does not accept (401).
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrForbidden: the token lacks the route's scope (403).
	ErrForbidden = errors.New("client: forbidden")
	// ErrUnavailable: the writer's store was unavailable and nothing was
	// written (503); the client retries these itself, see [WithRetry].
	ErrUnavailable = errors.New("client: the writer's store is unavailable")
	// ErrNotReproducible: a re-emission refused because a document's
	// stored rows do not reproduce its event (500).
	ErrNotReproducible = errors.New("client: a document does not reproduce its event")
)

// Error is an error answer of the writer, or of one line of a batch: its
// status (200 for a batch line), the code that names the problem and the
// writer's message. It matches with errors.Is the class of its code
// ([ErrInvalid], [ErrVersionConflict], ...).
type Error struct {
	StatusCode int
	Code       string // "" when the answer was not the writer's error shape (a proxy's page, say)
	Message    string
	Line       int // the input line of a batch, 0 otherwise

	notYet *notYetData // a projector's not_yet_applied data, when its answer had them
}

// notYetData are the writes a projector's not_yet_applied answer names.
type notYetData struct {
	pending []PendingWrite
	waited  time.Duration
}

func (e *Error) Error() string {
	switch {
	case e.StatusCode == 0:
		return fmt.Sprintf("refused before sending: %s", e.Message)
	case e.Code == "":
		return fmt.Sprintf("the writer answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
	case e.Line > 0:
		return fmt.Sprintf("line %d refused: %s (%s)", e.Line, e.Message, e.Code)
	}
	return fmt.Sprintf("the writer refused the request: %s (%s)", e.Message, e.Code)
}

// Is reports whether e is of the class target.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.Code != "" && (invalidCodes[e.Code] || tooLargeCodes[e.Code])
	case ErrTooLarge:
		return tooLargeCodes[e.Code]
	case ErrVersionConflict:
		return e.Code == CodeVersionConflict
	case ErrNotFound:
		return e.Code == CodeNotFound
	case ErrUnauthorized:
		return e.Code == CodeUnauthorized
	case ErrForbidden:
		return e.Code == CodeForbidden
	case ErrUnavailable:
		return e.Code == CodeStoreUnavailable || e.Code == CodeUnavailable ||
			(e.Code == "" && (e.StatusCode == http.StatusServiceUnavailable || e.StatusCode == http.StatusBadGateway || e.StatusCode == http.StatusGatewayTimeout))
	case ErrNotReproducible:
		return e.Code == CodeNotReproducible
	}
	return false
}

var tooLargeCodes = map[string]bool{
	CodeRequestTooLarge: true, CodeBodyTooLarge: true, CodeMetaTooLarge: true, CodeTooManyLinks: true,
	CodeTooManyTags: true, CodeTitleTooLong: true, CodeEventTooLarge: true,
}

var invalidCodes = map[string]bool{
	CodeInvalidJSON: true, CodeInvalidUTF8: true, CodeUnsupportedMediaType: true, CodeMissingKey: true,
	CodeKeyTooLong: true, CodeKeyControlChar: true, CodeKeyMismatch: true, CodeMissingVersion: true,
	CodeInvalidVersion: true, CodeInvalidMeta: true, CodeInvalidLink: true, CodeInvalidTag: true,
	CodeNULCharacter: true, CodeRejectedValue: true, CodeInvalidRequest: true, CodeTooManyKeys: true,
	CodeInvalidLimit: true,
}

// retryable reports whether err is worth sending the same request again:
// the writer wrote nothing (503), or it could not be reached. Writes are
// versioned, so a request that did reach the store and is sent again is
// answered "unchanged", never applied twice.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return errors.Is(e, ErrUnavailable)
	}
	var te *transportError
	if !errors.As(err, &te) {
		return false
	}
	// A certificate the client does not trust stays untrusted.
	var cv *tls.CertificateVerificationError
	return !errors.As(err, &cv)
}

// transportError is a request that got no answer.
type transportError struct {
	base string
	err  error
}

func (e *transportError) Error() string {
	return fmt.Sprintf("the writer at %s does not answer: %v", e.base, e.err)
}

func (e *transportError) Unwrap() error { return e.err }
