package embedded

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
)

// A damaged embedder.json is an error naming the file, and the index over
// the store refuses to open rather than take the configured embedder for
// the store's; one left half-written by a crash (its .tmp) changes nothing.
func TestDamagedEmbedderFileIsAnError(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, _ := embed.NewHash(64)
	if _, err := index.New(ctx, s, h, index.Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, EmbedderFile)
	if err := os.WriteFile(path+".tmp", []byte(`{"kind":"ha`), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, ok, err := s.Embedder(ctx); err != nil || !ok || id != embed.IdentityOf(h) {
		t.Fatalf("with a torn temporary file beside it: %+v, %v, %v", id, ok, err)
	}
	for _, bad := range []string{`{"kind":"ha`, `{"kind":"hash","model":"","dimension":64}`, `[]`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Embedder(ctx); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("Embedder with %s: %v; want an error naming %s", bad, err, path)
		}
		if _, err := index.New(ctx, s, h, index.Options{}); err == nil || !strings.Contains(err.Error(), "read the store's embedder") {
			t.Errorf("index.New with %s: %v; want it refused", bad, err)
		}
	}
}
