package contract

import (
	"errors"
	"fmt"
)

// Codes of [ValidationError]. They are stable: HTTP clients and dead-letter
// readers match on them.
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidUTF8      = "invalid_utf8"
	CodeMissingKey       = "missing_key"
	CodeKeyTooLong       = "key_too_long"
	CodeKeyControlChar   = "key_control_character"
	CodeKeyMismatch      = "key_mismatch"
	CodeMissingVersion   = "missing_version"
	CodeInvalidVersion   = "invalid_version"
	CodeTitleTooLong     = "title_too_long"
	CodeBodyTooLarge     = "body_too_large"
	CodeEventTooLarge    = "event_too_large"
	CodeNULCharacter     = "nul_character"
	CodeInvalidMeta      = "invalid_meta"
	CodeMetaTooLarge     = "meta_too_large"
	CodeInvalidLink      = "invalid_link"
	CodeTooManyLinks     = "too_many_links"
	CodeInvalidTag       = "invalid_tag"
	CodeTooManyTags      = "too_many_tags"
	CodeInvalidEvent     = "invalid_event"
	CodeUnknownSchema    = "unknown_schema"
	CodeIdentityMismatch = "identity_mismatch"
)

// ErrInvalid is matched by every [ValidationError] with errors.Is.
var ErrInvalid = errors.New("contract: invalid")

// ValidationError names what is wrong with a document or an event.
type ValidationError struct {
	Code    string // one of the Code constants
	Field   string // the offending field, when there is one
	Message string // a human sentence naming the problem
}

func (e *ValidationError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Field, e.Message, e.Code)
	}
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

// Is makes errors.Is(err, ErrInvalid) true for every ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// TooLarge reports whether the problem is a size limit (HTTP 413), as opposed
// to malformed input.
func (e *ValidationError) TooLarge() bool {
	switch e.Code {
	case CodeBodyTooLarge, CodeEventTooLarge, CodeMetaTooLarge, CodeTooManyLinks, CodeTooManyTags, CodeTitleTooLong:
		return true
	}
	return false
}

func invalid(code, field, format string, args ...any) *ValidationError {
	return &ValidationError{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}
