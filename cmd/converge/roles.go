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
	// Optional: a role a team grants to its application's own role needs
	// no password; one a producer connects as does.
	roles.Producer: "CONVERGE_PRODUCER_PASSWORD",
}

// rolesCmd is `converge roles apply`: make the cluster hold converge's
// roles and privileges (internal/roles), or print what that does.
func rolesCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "apply" {
		return service.Usage("roles needs a subcommand: apply [--print] [--json] -postgres-url ADMIN_URL [-database converge] [-relay-addr IP] [-owner-addr IP]")
	}
	f := config.NewFlags("converge roles apply")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "an administrator's URL (a superuser: it creates roles, one of them REPLICATION)")
	database := f.String("database", "CONVERGE_DATABASE", roles.DefaultDatabase, "converge's database, created when missing")
	printOnly := f.Bool("print", "", false, "print the statements (passwords as "+roles.PasswordPlaceholder+") and apply nothing")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	relayAddr := f.String("relay-addr", "CONVERGE_RELAY_ADDR", "", "the relay's IP address (or CIDR range), for the pg_hba.conf lines printed; empty: "+roles.AddressPlaceholder)
	ownerAddr := f.String("owner-addr", "CONVERGE_OWNER_ADDR", "", "the IP address (or CIDR range) `converge migrate up` runs from, for the pg_hba.conf lines printed; empty: "+roles.AddressPlaceholder)
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
	hba, err := roles.HBA(roles.HBAOptions{Database: *database, RelayAddress: *relayAddr, OwnerAddress: *ownerAddr})
	if err != nil {
		return service.Usage("roles apply: %w", err)
	}
	if *printOnly {
		plan, err := roles.Plan(opts)
		if err != nil {
			return err
		}
		if *asJSON {
			shown := make([]string, len(plan))
			for i, s := range plan {
				shown[i] = s.String()
			}
			return writeJSON(out, rolesPlanJSON{Database: *database, Statements: shown, HBA: hba, HBAComplete: hbaComplete(hba)})
		}
		fmt.Fprintf(out, "-- converge roles apply: the first statement on the administrator's connection, the others in one transaction in database %s\n", *database)
		for _, s := range plan {
			fmt.Fprintln(out, s.String())
		}
		fmt.Fprintln(out)
		printHBA(out, hba)
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
	report := rolesApplyJSON{Database: res.Database, CreatedDatabase: res.CreatedDatabase, HBA: hba, HBAComplete: hbaComplete(hba)}
	for _, r := range roles.Definition {
		rr := roleJSON{Name: r.Name, Job: r.Job, Password: "kept"}
		for _, c := range res.CreatedRoles {
			if c == r.Name {
				rr.Created = true
			}
		}
		switch {
		case opts.Passwords[r.Name] != "":
			rr.Password = "set"
		case rr.Created:
			rr.Password = "none"
		}
		report.Roles = append(report.Roles, rr)
	}
	if *asJSON {
		return writeJSON(out, report)
	}
	state := "exists"
	if res.CreatedDatabase {
		state = "created"
	}
	fmt.Fprintf(out, "database %s %s\n", res.Database, state)
	for _, r := range report.Roles {
		what := "exists"
		if r.Created {
			what = "created"
		}
		pw := "password " + r.Password
		if r.Password == "none" {
			pw = "no password (set " + rolePasswordEnv[r.Name] + " to give it one)"
		}
		fmt.Fprintf(out, "%-16s %s, %s: %s\n", r.Name, what, pw, r.Job)
	}
	fmt.Fprintln(out, "privileges applied; `converge migrate up` as "+roles.Owner+" grants what it creates")
	fmt.Fprintln(out)
	printHBA(out, hba)
	return nil
}

// rolesApplyJSON is `roles apply --json`.
type rolesApplyJSON struct {
	Database        string     `json:"database"`
	CreatedDatabase bool       `json:"created_database"`
	Roles           []roleJSON `json:"roles"`
	// HBA are the pg_hba.conf lines; HBAComplete is false while one of
	// them holds roles.AddressPlaceholder.
	HBA         []roles.HBALine `json:"pg_hba"`
	HBAComplete bool            `json:"pg_hba_complete"`
}

type roleJSON struct {
	Name    string `json:"name"`
	Created bool   `json:"created"`
	// Password is "set" (given to this run), "kept" or "none" (a new role
	// given none).
	Password string `json:"password"`
	Job      string `json:"job"`
}

// rolesPlanJSON is `roles apply --print --json`.
type rolesPlanJSON struct {
	Database    string          `json:"database"`
	Statements  []string        `json:"statements"`
	HBA         []roles.HBALine `json:"pg_hba"`
	HBAComplete bool            `json:"pg_hba_complete"`
}

func hbaComplete(lines []roles.HBALine) bool {
	for _, l := range lines {
		if strings.Contains(l.Line, roles.AddressPlaceholder) {
			return false
		}
	}
	return true
}

// printHBA prints the pg_hba.conf lines, each after a comment saying why,
// ready to be copied into the file.
func printHBA(out io.Writer, lines []roles.HBALine) {
	fmt.Fprintln(out, "# pg_hba.conf: put these lines above every other line (the first line that matches a connection decides),")
	fmt.Fprintln(out, "# then reload the server (SELECT pg_reload_conf()). What they cannot limit: docs/security.md.")
	if !hbaComplete(lines) {
		fmt.Fprintln(out, "# "+roles.AddressPlaceholder+" must be replaced by an address before use: give -relay-addr and -owner-addr.")
	}
	for _, l := range lines {
		fmt.Fprintln(out, "# "+l.Why)
		fmt.Fprintln(out, l.Line)
	}
}
