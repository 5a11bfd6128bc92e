package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/source"
)

const sourceUsage = `converge source: tables a team already has, mapped to documents

Usage:
  converge source apply [-reemit] [-only NAME] -config FILE -postgres-url OWNER_URL
        install each mapping of the configuration file's sources section, as the tables'
        owner: a view giving each row's document, granted to the writer alone, and triggers
        handing over, in the changing transaction, which rows changed; a new or changed
        mapping hands every row over (a backfill); -reemit hands every row over anyway
  converge source sql [-only NAME] -config FILE -postgres-url URL
        print what apply would run, for a database administrator to read or run
  converge source status [--json] -postgres-url URL
        each source's rows that give a document, handed-over rows not yet applied, and
        refused rows (kept in converge_inbox with the reason)

A mapping (docs/sources.md):

  sources:
    articles:
      table: shop.articles
      key: "'article/' || id"
      title: title
      body: body
      tags: ARRAY(SELECT t.name FROM shop.article_tags at JOIN shop.tags t ON t.id = at.tag_id WHERE at.article_id = articles.id)
      follow:
        - {table: shop.article_tags, row: article_id}
`

func sourceCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(out, sourceUsage)
		return nil
	}
	sub := args[0]
	f := config.NewFlags("converge source " + sub)
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL: for apply, a role owning the mapped tables and granted converge_producer")
	only := f.String("only", "", "", "apply or print this source alone (default: every source of the file)")
	reemit := f.Bool("reemit", "", false, "apply: hand every row over even when the mapping is unchanged (after a change of a table the mapping reads but does not follow)")
	asJSON := f.Bool("json", "", false, "status: machine-readable output")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, *pg)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer conn.Close(context.Background())
	switch sub {
	case "status":
		st, err := source.ReadStatus(ctx, conn)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(out, st)
		}
		if len(st) == 0 {
			fmt.Fprintln(out, "no source has rows, pending or refused")
			return nil
		}
		for _, s := range st {
			fmt.Fprintf(out, "%-20s %8d rows give documents  %6d pending  %6d refused\n", s.Name, s.Rows, s.Pending, s.Refused)
			if s.Refused > 0 {
				fmt.Fprintf(out, "%-20s SELECT row_id, refused_code, refused_message FROM converge_inbox WHERE source = '%s' AND refused_at IS NOT NULL\n", "", s.Name)
			}
		}
		return nil
	case "apply", "sql":
	default:
		return fmt.Errorf("unknown source subcommand %q: use apply, sql or status\n\n%s", sub, sourceUsage)
	}
	mappings, err := fileSources(f)
	if err != nil {
		return err
	}
	if *only != "" {
		i := slices.IndexFunc(mappings, func(m source.Mapping) bool { return m.Name == *only })
		if i < 0 {
			return fmt.Errorf("-only %s: the configuration file has no source of that name", *only)
		}
		mappings = mappings[i : i+1]
	}
	for _, m := range mappings {
		if sub == "sql" {
			script, err := source.SQL(ctx, conn, m)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, script)
			continue
		}
		res, err := source.Apply(ctx, conn, m, *reemit)
		if err != nil {
			return err
		}
		state := "unchanged"
		switch {
		case res.Created:
			state = "installed"
		case res.Changed:
			state = "changed"
		}
		fmt.Fprintf(out, "source %s: %s mapped by view %s: %s", m.Name, res.Table, res.View, state)
		if res.HandedOver > 0 || res.Created || res.Changed || *reemit {
			fmt.Fprintf(out, "; %d rows handed over to the writer (converge source status follows them)", res.HandedOver)
		}
		fmt.Fprintln(out)
	}
	return nil
}

// fileSources are the mappings of the configuration file's sources
// section.
func fileSources(f *config.Flags) ([]source.Mapping, error) {
	file := f.File()
	if file == nil {
		return nil, errors.New("no configuration file: name the one holding the sources section with -config (env CONVERGE_CONFIG)")
	}
	mappings, err := source.Parse(file.Path, file.Sources())
	if err != nil {
		return nil, err
	}
	if len(mappings) == 0 {
		return nil, fmt.Errorf("config file %s has no sources section (docs/sources.md)", file.Path)
	}
	return mappings, nil
}
