package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/service"
)

// rolePasswordEnv names the variable (or its _FILE) of each role's password.
var rolePasswordEnv = map[string]string{
	roles.Owner:  "CONVERGE_OWNER_PASSWORD",
	roles.Writer: "CONVERGE_WRITER_PASSWORD",
	roles.Relay:  "CONVERGE_RELAY_PASSWORD",
	roles.Reader: "CONVERGE_READER_PASSWORD",
}

// rolesCmd is `converge roles apply`: make the cluster hold converge's
// roles and privileges (internal/roles), or print what that does.
func rolesCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "apply" {
		return service.Usage("roles needs a subcommand: apply [--print] -postgres-url ADMIN_URL [-database converge]")
	}
	f := config.NewFlags("converge roles apply")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "an administrator's URL (a superuser: it creates roles, one of them REPLICATION)")
	database := f.String("database", "CONVERGE_DATABASE", roles.DefaultDatabase, "converge's database, created when missing")
	printOnly := f.Bool("print", "", false, "print the statements (passwords as "+roles.PasswordPlaceholder+") and apply nothing")
	passwords := map[string]*string{}
	for _, r := range roles.Definition {
		env := rolePasswordEnv[r.Name]
		passwords[r.Name] = f.String(strings.TrimPrefix(r.Name, "converge_")+"-password", env, "",
			"the password of "+r.Name+" (or "+env+"_FILE); empty: it keeps its password (a new role has none)")
	}
	if err := f.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return service.Usage("roles apply: %w", err)
	}
	if f.NArg() > 0 {
		return service.Usage("roles apply: unexpected argument %q", f.Arg(0))
	}
	opts := roles.Options{Database: *database, Passwords: map[string]string{}}
	for name, pw := range passwords {
		if *pw != "" {
			opts.Passwords[name] = *pw
		}
	}
	if err := opts.Validate(); err != nil {
		return service.Usage("%w", err)
	}
	if *printOnly {
		plan, err := roles.Plan(opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "-- converge roles apply: the first statement on the administrator's connection, the others in one transaction in database %s\n", *database)
		for _, s := range plan {
			fmt.Fprintln(out, s.String())
		}
		return nil
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return service.Usage("roles apply: %w", err)
	}
	conn, err := pgx.Connect(ctx, *pg)
	if err != nil {
		return fmt.Errorf("roles: connect: %w", err)
	}
	defer conn.Close(context.Background())
	res, err := roles.Apply(ctx, conn, opts)
	if err != nil {
		return err
	}
	state := "exists"
	if res.CreatedDatabase {
		state = "created"
	}
	fmt.Fprintf(out, "database %s %s\n", res.Database, state)
	for _, r := range roles.Definition {
		what := "exists"
		for _, c := range res.CreatedRoles {
			if c == r.Name {
				what = "created"
			}
		}
		pw := "password kept"
		switch {
		case opts.Passwords[r.Name] != "":
			pw = "password set"
		case what == "created":
			pw = "no password (set " + rolePasswordEnv[r.Name] + " to give it one)"
		}
		fmt.Fprintf(out, "%-16s %s, %s: %s\n", r.Name, what, pw, r.Job)
	}
	fmt.Fprintln(out, "privileges applied; `converge migrate up` as "+roles.Owner+" grants what it creates")
	return nil
}
