package testenv

import (
	"context"
	"testing"

	"github.com/converge-sync/converge/internal/schema"
)

// MigratedDatabase returns the URL of a new database holding converge's
// schema, cloned from a template migrated once per test package.
func (p *Postgres) MigratedDatabase(t testing.TB) string {
	t.Helper()
	return p.NewDatabaseFrom(t, "migrated", func(ctx context.Context, url string) error {
		_, err := schema.Up(ctx, url)
		return err
	})
}
