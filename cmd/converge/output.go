package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/converge-sync/converge/internal/auth"
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
	var untrusted *tls.CertificateVerificationError
	if err == nil || errors.As(err, &answered) || errors.Is(err, context.Canceled) ||
		errors.As(err, &untrusted) || errors.Is(err, auth.ErrPlainHTTP) {
		// A service whose certificate was refused is running (trustHint
		// says what to check); a token refused over plain HTTP was never
		// sent, and its error says what to do.
		return err
	}
	return fmt.Errorf("%w (is %s running? %s)", err, binary, flag)
}

// untrustedError is a request refused because the server's certificate
// is not trusted, with what to check.
type untrustedError struct{ err error }

func (e *untrustedError) Error() string {
	var unknown x509.UnknownAuthorityError
	if errors.As(e.err, &unknown) {
		return fmt.Sprintf("%v (the certificate is signed by a CA this command does not trust: name the CA's certificate with -tls-ca, env %s)", e.err, auth.EnvTLSCA)
	}
	return fmt.Sprintf("%v (check the certificate: it must name the host of the address, and chain to the CA of -tls-ca, env %s)", e.err, auth.EnvTLSCA)
}

func (e *untrustedError) Unwrap() error { return e.err }

// trustHint adds, to the error of a request refused because the server's
// certificate is not trusted, what to check: -tls-ca, most often.
func trustHint(err error) error {
	var untrusted *tls.CertificateVerificationError
	var hinted *untrustedError
	if !errors.As(err, &untrusted) || errors.As(err, &hinted) {
		return err
	}
	return &untrustedError{err: err}
}
