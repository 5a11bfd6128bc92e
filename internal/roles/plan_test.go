package roles_test

import (
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/roles"
)

// A plan shows every password as the placeholder and executes its verifier;
// a role given no password gets no password step.
func TestPlanNeverShowsAPassword(t *testing.T) {
	const secret = "s3cret-for-the-writer"
	plan, err := roles.Plan(roles.Options{Passwords: map[string]string{roles.Writer: secret}})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, s := range plan {
		if strings.Contains(s.Shown, secret) || strings.Contains(s.String(), secret) || strings.Contains(s.SQL, secret) {
			t.Errorf("the password appears in %q", s.Shown)
		}
		if strings.Contains(s.SQL, " PASSWORD ") {
			steps = append(steps, s.Shown)
			if !strings.Contains(s.SQL, "'SCRAM-SHA-256$4096:") || !strings.Contains(s.Shown, roles.PasswordPlaceholder) {
				t.Errorf("password step executes %q, shows %q", s.SQL[:strings.Index(s.SQL, " PASSWORD ")], s.Shown)
			}
		}
	}
	if want := `ALTER ROLE "converge_writer" PASSWORD '<password>'`; len(steps) != 1 || steps[0] != want {
		t.Errorf("password steps %q, want [%q]", steps, want)
	}
	if first := plan[0]; !first.BeforeTransaction || first.Shown != `CREATE DATABASE "converge"` || first.When == "" {
		t.Errorf("first step %+v", first)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		opts roles.Options
		want string // "" valid; else a part of the error
	}{
		{"defaults", roles.Options{}, ""},
		{"every password", roles.Options{Database: "converge_prod", Passwords: map[string]string{
			roles.Owner: "a", roles.Writer: "b c", roles.Relay: `d'e"f`, roles.Reader: "~!@#"}}, ""},
		{"not a role", roles.Options{Passwords: map[string]string{"postgres": "x"}}, `"postgres", which is not one of converge's roles`},
		{"non-ASCII", roles.Options{Passwords: map[string]string{roles.Relay: "pässword"}}, "the password of converge_relay has a character outside printable ASCII (at byte 1)"},
		{"newline", roles.Options{Passwords: map[string]string{roles.Relay: "pw\n"}}, "outside printable ASCII (at byte 2)"},
		{"long database", roles.Options{Database: strings.Repeat("d", 64)}, "at most 63 bytes"},
	} {
		err := c.opts.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func TestURL(t *testing.T) {
	for _, c := range []struct{ base, role, password, want string }{
		{"postgres://postgres:admin@db:5432/converge?sslmode=disable", roles.Writer, "p@ss/w:rd",
			"postgres://converge_writer:p%40ss%2Fw%3Ard@db:5432/converge?sslmode=disable"},
		{"postgresql://db/converge", roles.Reader, "", "postgresql://converge_reader@db/converge"},
	} {
		got, err := roles.URL(c.base, c.role, c.password)
		if err != nil || got != c.want {
			t.Errorf("URL(%q, %q): %q %v, want %q", c.base, c.role, got, err, c.want)
		}
	}
	if _, err := roles.URL("host=db user=x password=secret", roles.Writer, ""); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a keyword DSN: %v", err)
	}
}
