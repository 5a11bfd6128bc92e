package config_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/version"
)

func TestFlagsTakeEnvironmentDefaults(t *testing.T) {
	t.Setenv("CONVERGE_TEST_ADDR", "127.0.0.1:9999")
	t.Setenv("CONVERGE_TEST_N", "7")
	t.Setenv("CONVERGE_TEST_D", "250ms")
	t.Setenv("CONVERGE_TEST_B", "true")
	f := config.NewFlags("t")
	addr := f.String("addr", "CONVERGE_TEST_ADDR", "x", "")
	n := f.Int("n", "CONVERGE_TEST_N", 1, "")
	d := f.Duration("d", "CONVERGE_TEST_D", time.Second, "")
	b := f.Bool("b", "CONVERGE_TEST_B", false, "")
	def := f.String("def", "CONVERGE_TEST_UNSET", "fallback", "")
	if err := f.Parse([]string{"-n", "9"}); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:9999" || *n != 9 || *d != 250*time.Millisecond || !*b || *def != "fallback" {
		t.Fatalf("got %q %d %v %v %q", *addr, *n, *d, *b, *def)
	}
}

func TestBadEnvironmentValueIsNamed(t *testing.T) {
	t.Setenv("CONVERGE_TEST_N", "seven")
	f := config.NewFlags("t")
	f.Int("n", "CONVERGE_TEST_N", 1, "")
	err := f.Parse(nil)
	if err == nil || !strings.Contains(err.Error(), "CONVERGE_TEST_N") {
		t.Fatalf("err = %v", err)
	}
}

func TestSecretFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONVERGE_TEST_SECRET_FILE", path)
	v, ok, err := config.Lookup("CONVERGE_TEST_SECRET")
	if err != nil || !ok || v != "s3cret" {
		t.Fatalf("Lookup = %q %v %v", v, ok, err)
	}
	t.Setenv("CONVERGE_TEST_SECRET_FILE", filepath.Join(t.TempDir(), "missing"))
	if _, _, err := config.Lookup("CONVERGE_TEST_SECRET"); err == nil {
		t.Fatal("a missing secret file must be an error")
	}
}

// A value from the environment (a password, a URL with one) never shows
// in -h or in a usage error: the built-in default does.
func TestHelpNeverShowsAValueFromTheEnvironment(t *testing.T) {
	t.Setenv("CONVERGE_TEST_SECRET", "hunter2-secret")
	t.Setenv("CONVERGE_TEST_SECRET_N", "4242")
	f := config.NewFlags("x")
	var out strings.Builder
	f.SetOutput(&out)
	pw := f.String("password", "CONVERGE_TEST_SECRET", "", "a password")
	n := f.Int("n", "CONVERGE_TEST_SECRET_N", 7, "a number")
	if err := f.Parse([]string{"-bogus"}); err == nil {
		t.Fatal("an unknown flag parsed")
	}
	if strings.Contains(out.String(), "hunter2") || strings.Contains(out.String(), "4242") {
		t.Fatalf("usage shows a value from the environment:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "(default 7)") {
		t.Fatalf("usage lost the built-in default:\n%s", out.String())
	}
	if *pw != "hunter2-secret" || *n != 4242 {
		t.Fatalf("the environment no longer sets the values: %q %d", *pw, *n)
	}
}

// -version prints the build and asks for the exit of -h, whatever the
// other flags; without it, parsing is as before.
func TestVersionFlag(t *testing.T) {
	f := config.NewFlags("relay")
	f.String("metrics-addr", "", "127.0.0.1:9102", "")
	var out strings.Builder
	f.SetOutput(&out)
	if err := f.Parse([]string{"-metrics-addr", "x", "-version"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parse -version: %v, want flag.ErrHelp", err)
	}
	if got := strings.TrimSpace(out.String()); got != version.Get().String() || !strings.HasPrefix(got, "converge ") {
		t.Fatalf("-version printed %q, want %q", got, version.Get().String())
	}
	f = config.NewFlags("relay")
	addr := f.String("metrics-addr", "", "127.0.0.1:9102", "")
	if err := f.Parse([]string{"-metrics-addr", "x"}); err != nil || *addr != "x" {
		t.Fatalf("parse without -version: %v, addr %q", err, *addr)
	}
}
