package testenv

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

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

// MigratedDatabaseForRun creates a database holding converge's schema for
// what runs outside any one test (a package's examples), and returns its
// URL. It lives as long as the cluster.
func (p *Postgres) MigratedDatabaseForRun(ctx context.Context, name string) (string, error) {
	if !validName.MatchString(name) {
		return "", fmt.Errorf("testenv: database name %q must match %s", name, validName)
	}
	if _, err := p.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{"run_" + name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testenv: create database run_%s: %w", name, err)
	}
	url := p.Cluster.URL("run_" + name)
	if _, err := schema.Up(ctx, url); err != nil {
		return "", err
	}
	return url, nil
}
