package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// writeJSON writes v as the indented JSON of a command's --json output.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeAnswerJSON writes v, an answer of a service's API, as --json output
// in the form the service writes it: one line, HTML characters as they are.
func writeAnswerJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// serviceHint adds, to the error of a service that did not answer (not an
// error answer of its API, of type *E), which binary and flag to check.
func serviceHint[E error](err error, binary, flag string) error {
	var answered E
	if err == nil || errors.As(err, &answered) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w (is %s running? %s)", err, binary, flag)
}
