package main

import (
	"errors"
	"fmt"
)

// usageError is a command line that cannot run as given (an unknown name,
// a value out of range): converge exits 2 on it, as for a bad flag, rather
// than 1, which says the command ran and failed.
type usageError struct {
	err error
}

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

func (e *usageError) Error() string { return e.err.Error() }

func (e *usageError) Unwrap() error { return e.err }

// exitCode is the exit status of a command that returned err (not nil).
func exitCode(err error) int {
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}
