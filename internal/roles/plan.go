package roles

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultDatabase is the database Apply prepares when Options names none.
const DefaultDatabase = "converge"

// Options of [Plan] and [Apply].
type Options struct {
	// Database is converge's database; default DefaultDatabase. Apply
	// creates it when it does not exist.
	Database string
	// Passwords by role name. A role not in it (or given "") keeps its
	// password; a role created without one has none.
	Passwords map[string]string
}

func (o Options) database() string {
	if o.Database == "" {
		return DefaultDatabase
	}
	return o.Database
}

// Validate reports a database name Postgres refuses and passwords that
// cannot be sent as a verifier (see checkPassword), or given for a role
// that is not converge's.
func (o Options) Validate() error {
	db := o.database()
	if len(db) > 63 || strings.ContainsRune(db, 0) {
		return fmt.Errorf("roles: database name %q: at most 63 bytes, no NUL", db)
	}
	var errs []error
	for role, pw := range o.Passwords {
		if !isRole(role) {
			errs = append(errs, fmt.Errorf("roles: a password for %q, which is not one of converge's roles (%s)", role, strings.Join(Names(), ", ")))
			continue
		}
		if err := checkPassword(role, pw); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isRole(name string) bool {
	for _, r := range Definition {
		if r.Name == name {
			return true
		}
	}
	return false
}

// Statement is one step of a [Plan].
type Statement struct {
	// SQL is what Apply executes (a password in it as its verifier).
	SQL string
	// Shown is SQL as printed: a password as PasswordPlaceholder.
	Shown string
	// When, if set, is a query whose boolean answer says whether Apply
	// runs SQL: the step is about an object that may not exist yet.
	When string
	// BeforeTransaction: the step runs on the administrator's connection,
	// before the transaction (CREATE DATABASE cannot run inside one);
	// every other step runs in one transaction in the database.
	BeforeTransaction bool
}

// PasswordPlaceholder stands for a password in [Statement.Shown].
const PasswordPlaceholder = "<password>"

// String is the statement as shown, with its condition as a comment.
func (s Statement) String() string {
	if s.When == "" {
		return s.Shown + ";"
	}
	return "-- when " + s.When + "\n" + s.Shown + ";"
}

func stmt(sql string) Statement { return Statement{SQL: sql, Shown: sql} }

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func qualified(name string) string { return pgx.Identifier{Schema, name}.Sanitize() }

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// exists is the condition of a step about the relation name.
func exists(name string) string {
	return "SELECT to_regclass(" + literal(qualified(name)) + ") IS NOT NULL"
}

// Plan is what [Apply] does, in order: the database, then each role (its
// attributes, password and memberships), its privileges on the database
// and the schema, the owner's ownership of the schema's objects, and the
// privileges on them.
func Plan(opts Options) ([]Statement, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	db := opts.database()
	out := []Statement{{
		SQL: "CREATE DATABASE " + ident(db), Shown: "CREATE DATABASE " + ident(db),
		When:              "SELECT NOT EXISTS (SELECT FROM pg_database WHERE datname = " + literal(db) + ")",
		BeforeTransaction: true,
	}}
	for _, r := range Definition {
		role := ident(r.Name)
		// Created without attributes, then given exactly the definition's:
		// the same two steps whether the role is new or has drifted. A
		// concurrent Apply creating it first is no error.
		out = append(out, stmt("DO $$ BEGIN CREATE ROLE "+role+"; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"))
		repl := "NOREPLICATION"
		if r.Replication {
			repl = "REPLICATION"
		}
		out = append(out, stmt("ALTER ROLE "+role+" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT "+repl+" NOBYPASSRLS CONNECTION LIMIT -1"))
		if pw := opts.Passwords[r.Name]; pw != "" {
			v, err := scramVerifier(pw, newSalt())
			if err != nil {
				return nil, err
			}
			out = append(out, Statement{SQL: "ALTER ROLE " + role + " PASSWORD " + literal(v),
				Shown: "ALTER ROLE " + role + " PASSWORD " + literal(PasswordPlaceholder)})
		}
		// A membership would lend it another role's privileges.
		out = append(out, stmt("DO $$ DECLARE g regrole; BEGIN FOR g IN SELECT roleid::regrole FROM pg_auth_members WHERE member = "+
			literal(r.Name)+"::regrole LOOP EXECUTE format('REVOKE %s FROM "+role+"', g); END LOOP; END $$"))
	}

	all := "PUBLIC"
	for _, r := range Definition {
		all += ", " + ident(r.Name)
	}
	out = append(out, stmt("REVOKE ALL ON DATABASE "+ident(db)+" FROM "+all))
	for _, r := range Definition {
		out = append(out, stmt("GRANT "+r.OnDatabase+" ON DATABASE "+ident(db)+" TO "+ident(r.Name)))
	}
	out = append(out, stmt("REVOKE ALL ON SCHEMA "+ident(Schema)+" FROM "+all))
	for _, r := range Definition {
		out = append(out, stmt("GRANT "+r.OnSchema+" ON SCHEMA "+ident(Schema)+" TO "+ident(r.Name)))
	}
	for _, r := range Definition {
		if !r.Owns {
			continue
		}
		for _, t := range Tables {
			out = append(out, Statement{SQL: "ALTER TABLE " + qualified(t) + " OWNER TO " + ident(r.Name),
				Shown: "ALTER TABLE " + qualified(t) + " OWNER TO " + ident(r.Name), When: exists(t)})
		}
		for _, s := range Sequences {
			out = append(out, Statement{SQL: "ALTER SEQUENCE " + qualified(s) + " OWNER TO " + ident(r.Name),
				Shown: "ALTER SEQUENCE " + qualified(s) + " OWNER TO " + ident(r.Name), When: exists(s)})
		}
		sql := "ALTER PUBLICATION " + ident(Publication) + " OWNER TO " + ident(r.Name)
		out = append(out, Statement{SQL: sql, Shown: sql,
			When: "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = " + literal(Publication) + ")"})
	}
	return append(out, objectGrants(Definition)...), nil
}

// objectGrants takes back every privilege on the schema's tables and
// sequences from roles, and on converge's own tables and sequences from
// PUBLIC (another application's tables in the schema keep their PUBLIC
// grants), then grants roles' own, each on an object that exists.
func objectGrants(roles []Role) []Statement {
	var from []string
	for _, r := range roles {
		if !r.Owns {
			from = append(from, ident(r.Name))
		}
	}
	fromRoles := strings.Join(from, ", ")
	out := []Statement{
		stmt("REVOKE ALL ON ALL TABLES IN SCHEMA " + ident(Schema) + " FROM " + fromRoles),
		stmt("REVOKE ALL ON ALL SEQUENCES IN SCHEMA " + ident(Schema) + " FROM " + fromRoles),
	}
	for _, t := range Tables {
		sql := "REVOKE ALL ON TABLE " + qualified(t) + " FROM PUBLIC"
		out = append(out, Statement{SQL: sql, Shown: sql, When: exists(t)})
	}
	for _, q := range Sequences {
		sql := "REVOKE ALL ON SEQUENCE " + qualified(q) + " FROM PUBLIC"
		out = append(out, Statement{SQL: sql, Shown: sql, When: exists(q)})
	}
	// The views of mapped tables (converge source apply) in the schema
	// lost the writer's SELECT with the REVOKE above: given back.
	out = append(out, Statement{SQL: `DO $$
DECLARE v regclass;
BEGIN
    FOR v IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ` + literal(Schema) + ` AND c.relkind = 'v' AND c.relname LIKE 'converge\_source\_%' LOOP
        EXECUTE format('GRANT SELECT ON %s TO %I', v, ` + literal(Writer) + `);
    END LOOP;
END
$$`, Shown: "GRANT SELECT ON each source's view (" + Schema + ".converge_source_*) TO " + Writer})
	for _, r := range roles {
		for _, g := range r.Grants {
			kind := "TABLE"
			if g.Sequence {
				kind = "SEQUENCE"
			}
			for _, o := range g.Objects {
				sql := "GRANT " + g.Privileges + " ON " + kind + " " + qualified(o) + " TO " + ident(r.Name)
				out = append(out, Statement{SQL: sql, Shown: sql, When: exists(o)})
			}
		}
	}
	return out
}
