package auth

import (
	"errors"
	"fmt"
)

// Reasons a tokens file is refused, matched with errors.Is on the
// [*LineError] that names the line.
var (
	ErrMalformedLine  = errors.New("a line must be: name scopes token")
	ErrEmptyToken     = errors.New("the token is missing")
	ErrShortToken     = fmt.Errorf("the token is shorter than %d bytes", MinTokenBytes)
	ErrTokenCharacter = errors.New("the token holds a character other than printable ASCII")
	ErrUnknownScope   = errors.New("unknown scope")
	ErrDuplicateToken = errors.New("the same token is on another line")
	ErrNoTokens       = errors.New("the file holds no token: authentication would be off")
)

// ErrPlainHTTP is matched by the refusal of [CheckPlainHTTP] and
// [CheckSend]: a bearer token over plain HTTP beyond loopback.
var ErrPlainHTTP = errors.New("a token would cross the network in clear")

// LineError is a line of a tokens file that was refused. Its message names
// the file and the line, never the token.
type LineError struct {
	Path   string // "" when not read from a file
	Line   int
	Err    error  // one of the Err sentinels
	Detail string // more about Err, without the token
}

func (e *LineError) Error() string {
	where := fmt.Sprintf("line %d", e.Line)
	if e.Path != "" {
		where = e.Path + ":" + fmt.Sprint(e.Line)
	}
	if e.Detail != "" {
		return fmt.Sprintf("auth: tokens file %s: %v: %s", where, e.Err, e.Detail)
	}
	return fmt.Sprintf("auth: tokens file %s: %v", where, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }
