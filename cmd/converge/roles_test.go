package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/service"
)

// roles apply creates the roles with the passwords it is given (from a
// variable or its _FILE), reports what it did, and the second time finds
// everything there; --print shows the statements and no password.
func TestRolesApply(t *testing.T) {
	ctx := context.Background()
	admin := pg.NewDatabase(t)
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	const writerPW, relayPW = "writer-secret-1", "relay-secret-2"
	t.Setenv("CONVERGE_WRITER_PASSWORD", writerPW)
	pwFile := filepath.Join(t.TempDir(), "relay")
	if err := os.WriteFile(pwFile, []byte(relayPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONVERGE_RELAY_PASSWORD_FILE", pwFile)

	var out bytes.Buffer
	if err := rolesCmd(ctx, []string{"apply", "--print", "-database", db}, &out); err != nil {
		t.Fatal(err)
	}
	printed := out.String()
	for _, want := range []string{`ALTER ROLE "converge_writer" PASSWORD '<password>';`, `ALTER ROLE "converge_relay" PASSWORD '<password>';`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."documents" TO "converge_writer";`, `CREATE DATABASE "` + db + `";`} {
		if !strings.Contains(printed, want) {
			t.Errorf("--print lacks %q:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, writerPW) || strings.Contains(printed, relayPW) || strings.Contains(printed, `"converge_owner" PASSWORD`) {
		t.Errorf("--print shows a password, or one nobody gave:\n%s", printed)
	}

	for i, want := range []string{"password set", "password set"} {
		out.Reset()
		if err := rolesCmd(ctx, []string{"apply", "-postgres-url", admin, "-database", db}, &out); err != nil {
			t.Fatalf("apply #%d: %v", i+1, err)
		}
		if !strings.Contains(out.String(), "database "+db+" exists") || !strings.Contains(out.String(), "converge_writer  ") ||
			!strings.Contains(out.String(), want) || strings.Contains(out.String(), writerPW) {
			t.Errorf("apply #%d said:\n%s", i+1, out.String())
		}
	}
	out.Reset()
	if err := rolesCmd(ctx, []string{"apply", "--json", "-postgres-url", admin, "-database", db, "-relay-addr", "10.0.0.5"}, &out); err != nil {
		t.Fatal(err)
	}
	var report rolesApplyJSON
	if err := json.Unmarshal(out.Bytes(), &report); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	passwordOf := map[string]string{}
	for _, r := range report.Roles {
		passwordOf[r.Name] = r.Password
	}
	if report.Database != db || report.CreatedDatabase || passwordOf[roles.Writer] != "set" || passwordOf[roles.Owner] != "kept" ||
		len(report.HBA) == 0 || report.HBA[0].Line != "hostssl "+db+" converge_relay 10.0.0.5/32 scram-sha-256" || report.HBAComplete {
		t.Errorf("apply --json:\n%s", out.String())
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var withPassword []string
	rows, err := conn.Query(ctx, `SELECT rolname FROM pg_authid WHERE rolname IN ('converge_writer', 'converge_relay') AND rolpassword LIKE 'SCRAM-SHA-256$4096:%' ORDER BY 1`)
	if err == nil {
		withPassword, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || strings.Join(withPassword, " ") != "converge_relay converge_writer" {
		t.Errorf("roles with a SCRAM verifier: %v (%v)", withPassword, err)
	}
	var connect bool
	if err := conn.QueryRow(ctx, `SELECT has_database_privilege($1, current_database(), 'CONNECT')`, roles.Reader).Scan(&connect); err != nil || !connect {
		t.Errorf("the reader may not connect: %v %v", connect, err)
	}
}

func TestRolesApplyUsage(t *testing.T) {
	t.Setenv("CONVERGE_POSTGRES_URL", "")
	for _, args := range [][]string{
		{},
		{"grant"},
		{"apply"}, // no -postgres-url
		{"apply", "-postgres-url", "postgres://x@127.0.0.1:1/postgres", "extra"},
		{"apply", "--print", "-reader-password", "pässword"},
		{"apply", "-nosuch"},
	} {
		err := rolesCmd(context.Background(), args, io.Discard)
		if code := service.ExitCode("converge", err, io.Discard); code != 2 {
			t.Errorf("roles %q: %v (exit %d), want a usage error", args, err, code)
		}
	}
}

// roles apply prints the pg_hba.conf lines for the addresses it is given
// (a bare IP address as that address alone), with a placeholder and a
// warning for an address it is not given, in its text and --json output.
func TestRolesApplyPrintsHBALines(t *testing.T) {
	t.Setenv("CONVERGE_RELAY_ADDR", "")
	t.Setenv("CONVERGE_OWNER_ADDR", "")
	var out bytes.Buffer
	if err := rolesCmd(context.Background(), []string{"apply", "--print", "-database", "docs", "-relay-addr", "10.0.0.5"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\nhostssl docs converge_relay 10.0.0.5/32 scram-sha-256\n",
		"\nhostssl docs converge_owner <address> scram-sha-256\n",
		"\nhostssl docs converge_writer,converge_reader,converge_producer all scram-sha-256\n",
		"\nhost all converge_owner,converge_writer,converge_relay,converge_reader,converge_producer all reject\n",
		"\nhost replication converge_owner,converge_writer,converge_relay,converge_reader,converge_producer all reject\n",
		"# <address> must be replaced by an address before use: give -relay-addr and -owner-addr.\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--print lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	t.Setenv("CONVERGE_OWNER_ADDR", "10.0.1.0/24")
	if err := rolesCmd(context.Background(), []string{"apply", "--print", "--json", "-relay-addr", "fd00::5"}, &out); err != nil {
		t.Fatal(err)
	}
	var plan rolesPlanJSON
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	var lines []string
	for _, l := range plan.HBA {
		lines = append(lines, l.Line)
	}
	if !plan.HBAComplete || len(plan.Statements) == 0 || len(lines) < 2 ||
		lines[0] != "hostssl converge converge_relay fd00::5/128 scram-sha-256" || lines[1] != "hostssl converge converge_owner 10.0.1.0/24 scram-sha-256" {
		t.Errorf("--print --json: complete %v, %d statements, pg_hba %q", plan.HBAComplete, len(plan.Statements), lines)
	}
	if strings.Contains(out.String(), roles.AddressPlaceholder) {
		t.Errorf("--print --json with both addresses shows a placeholder:\n%s", out.String())
	}

	for _, addr := range []string{"relay.internal", "10.0.0.300", "fe80::1%eth0"} {
		err := rolesCmd(context.Background(), []string{"apply", "--print", "-relay-addr", addr}, io.Discard)
		if code := service.ExitCode("converge", err, io.Discard); code != 2 {
			t.Errorf("-relay-addr %q: %v (exit %d), want a usage error", addr, err, code)
		}
	}
}
