package service

import (
	"errors"
	"fmt"
)

// UsageError is a command line or configuration that cannot run: a
// missing or unknown setting. The command exits 2 on it, like flag's
// errors.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage is a UsageError for the formatted message (with %w support).
func Usage(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// IsUsage reports whether err is a usage error: a UsageError, a bad flag,
// or a configuration that config.Require refused.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
