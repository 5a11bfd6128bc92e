package config_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
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

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "converge.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigFileGivesWhatNeitherFlagNorVariableGives(t *testing.T) {
	path := writeConfig(t, `
common:
  a: from-common
  b: from-common
  c: from-common
  d: from-common
  other-commands-setting: x
relay:
  b: from-section
  c: from-section
  d: from-section
  n: 12
  wait: 90s
  on: true
`)
	t.Setenv("CONVERGE_TEST_C", "from-env")
	t.Setenv(config.EnvConfig, path)
	f := config.NewFlags("relay")
	a := f.String("a", "CONVERGE_TEST_A", "default", "")
	b := f.String("b", "CONVERGE_TEST_B", "default", "")
	c := f.String("c", "CONVERGE_TEST_C", "default", "")
	d := f.String("d", "CONVERGE_TEST_D", "default", "")
	e := f.String("e", "CONVERGE_TEST_E", "default", "")
	n := f.Int("n", "", 1, "")
	wait := f.Duration("wait", "", time.Second, "")
	on := f.Bool("on", "", false, "")
	if err := f.Parse([]string{"-d", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	got := []string{*a, *b, *c, *d, *e}
	want := []string{"from-common", "from-section", "from-env", "from-flag", "default"}
	if !slices.Equal(got, want) || *n != 12 || *wait != 90*time.Second || !*on {
		t.Fatalf("got %q %d %v %v, want %q 12 1m30s true", got, *n, *wait, *on, want)
	}
	if f.Lookup("b").DefValue != "default" {
		t.Fatalf("-h shows %q as b's default, not the built-in one", f.Lookup("b").DefValue)
	}
}

func TestConfigFileFlagNamesTheFile(t *testing.T) {
	path := writeConfig(t, "writer:\n  a: from-file\n")
	f := config.NewFlags("converge writer")
	a := f.String("a", "", "default", "")
	if err := f.Parse([]string{"-config", path}); err != nil {
		t.Fatal(err)
	}
	if *a != "from-file" || f.Section() != "writer" {
		t.Fatalf("a = %q, section %q", *a, f.Section())
	}
}

func TestConfigFileErrorsNameTheLineAndSetting(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"relya:\n  a: x\n", `converge.yaml:1: unknown section "relya"`},
		{"relay:\n  a: x\n  windw: 3\n", "converge.yaml:3: relay.windw is not a setting of relay"},
		{"relay:\n  n: seven\n", "converge.yaml:2: relay.n: invalid value"},
		{"relay:\n  a: [x, y]\n", "converge.yaml:2: relay.a must be a single value"},
		{"relay: 3\n", "converge.yaml:1: section relay must be a mapping"},
		{"- relay\n", "expected a mapping of sections"},
		{"relay:\n  a: x\n  a: y\n", "relay.a given twice"},
		{"relay:\n  config: other.yaml\n", "relay.config cannot be set in the file"},
		{"relay:\n  a: 'unterminated\n", "converge.yaml"},
	} {
		path := writeConfig(t, c.body)
		f := config.NewFlags("relay")
		f.String("a", "", "", "")
		f.Int("n", "", 1, "")
		err := f.Parse([]string{"-config", path})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.body, err, c.want)
		}
	}
}

func TestEmptyConfigFileGivesNothing(t *testing.T) {
	path := writeConfig(t, "")
	f := config.NewFlags("relay")
	a := f.String("a", "", "default", "")
	if err := f.Parse([]string{"-config", path}); err != nil || *a != "default" {
		t.Fatalf("a = %q, err = %v", *a, err)
	}
	f = config.NewFlags("relay")
	f.String("a", "", "default", "")
	if err := f.Parse([]string{"-config", filepath.Join(t.TempDir(), "missing.yaml")}); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("a missing file: err = %v", err)
	}
}

func TestCheckReportsKeysNoCommandHas(t *testing.T) {
	file, err := config.ParseFile("c.yaml", []byte("common:\n  nats-url: x\n  natsurl: y\nrelay:\n  window: 3\n  slot: s\ncli:\n  windw: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = file.Check(map[string][]string{"relay": {"nats-url", "window"}, "cli": {"nats-url"}})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"c.yaml:3: common.natsurl", "c.yaml:6: relay.slot", "c.yaml:8: cli.windw"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "nats-url") || strings.Contains(err.Error(), "window:") {
		t.Errorf("%v\nnames a known key", err)
	}
}

func TestSectionOf(t *testing.T) {
	for name, want := range map[string]string{
		"relay": "relay", "converge relay": "relay", "projector-index": "projector-index",
		"converge projector-graph": "projector-graph", "converge dev": "dev", "converge demo": "dev",
		"converge verify": "cli", "converge dlq list": "cli", "t": "t",
	} {
		if got := config.SectionOf(name); got != want {
			t.Errorf("SectionOf(%q) = %q, want %q", name, got, want)
		}
	}
}
