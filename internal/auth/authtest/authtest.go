// Package authtest makes bearer tokens for tests of the APIs that check
// them.
package authtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
)

// Tokens writes text (tokens-file lines: name scopes token) to a file of
// the test's temporary directory and loads it, as a service's
// -tokens-file would be.
func Tokens(t testing.TB, text string) *auth.Tokens {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}
