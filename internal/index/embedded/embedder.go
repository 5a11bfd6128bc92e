package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/storage/atomicfile"
)

// EmbedderFile is the file in the store's directory that names the
// embedder of its vectors (JSON, an [embed.Identity]).
const EmbedderFile = "embedder.json"

// Embedder returns the identity recorded in the store's directory; see
// [index.Backend].
func (s *Store) Embedder(ctx context.Context) (embed.Identity, bool, error) {
	if err := ctx.Err(); err != nil {
		return embed.Identity{}, false, err
	}
	path := filepath.Join(s.dir, EmbedderFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return embed.Identity{}, false, nil
	}
	if err != nil {
		return embed.Identity{}, false, fmt.Errorf("embedded index: %w", err)
	}
	var id embed.Identity
	if err := json.Unmarshal(b, &id); err != nil {
		return embed.Identity{}, false, fmt.Errorf("embedded index: %s is not an embedder identity: %w", path, err)
	}
	if err := id.Validate(); err != nil {
		return embed.Identity{}, false, fmt.Errorf("embedded index: %s: %w", path, err)
	}
	return id, true, nil
}

// RecordEmbedder writes the identity to the store's directory, replacing
// the file in one step; see [index.Backend].
func (s *Store) RecordEmbedder(ctx context.Context, id embed.Identity) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := id.Validate(); err != nil {
		return fmt.Errorf("embedded index: %w", err)
	}
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(s.dir, EmbedderFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("embedded index: record the embedder: %w", err)
	}
	return nil
}
