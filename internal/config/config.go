// Package config binds command-line flags to environment variables: every
// flag of every converge binary has a variable, and the flag wins when both
// are given. A secret variable X may instead be given as X_FILE, a path to
// read it from.
package config

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/version"
)

// Env names shared by the binaries.
const (
	EnvPostgresURL = "CONVERGE_POSTGRES_URL"
	EnvNATSURL     = "CONVERGE_NATS_URL"
	EnvHTTPAddr    = "CONVERGE_HTTP_ADDR"
	EnvMetricsAddr = "CONVERGE_METRICS_ADDR"
	EnvDataDir     = "CONVERGE_DATA_DIR"
	EnvLogLevel    = "CONVERGE_LOG_LEVEL"
)

// Lookup returns the value of env, or of the file named by env_FILE
// (trailing newline removed), and whether either was set.
func Lookup(env string) (string, bool, error) {
	if v, ok := os.LookupEnv(env); ok {
		return v, true, nil
	}
	if path, ok := os.LookupEnv(env + "_FILE"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false, fmt.Errorf("config: %s_FILE: %w", env, err)
		}
		return strings.TrimRight(string(b), "\r\n"), true, nil
	}
	return "", false, nil
}

// Flags wraps a FlagSet so that each flag's default comes from its
// environment variable when that is set.
type Flags struct {
	*flag.FlagSet
	errs    []error
	version *bool
}

// NewFlags returns Flags for a command, with -version, which prints the
// build (internal/version) instead of running the command.
func NewFlags(name string) *Flags {
	f := &Flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
	f.version = f.FlagSet.Bool("version", false, "print the build (version, commit, Go version) and exit")
	return f
}

func (f *Flags) lookup(env string) (string, bool) {
	if env == "" {
		return "", false
	}
	v, ok, err := Lookup(env)
	if err != nil {
		f.errs = append(f.errs, err)
	}
	return v, ok
}

func usage(u, env string) string {
	if env == "" {
		return u
	}
	return u + " (env " + env + ")"
}

// String defines a string flag bound to env.
func (f *Flags) String(name, env, def, u string) *string {
	builtin := def
	if v, ok := f.lookup(env); ok {
		def = v
	}
	p := f.FlagSet.String(name, def, usage(u, env))
	f.showDefault(name, builtin)
	return p
}

// showDefault makes -h and a usage error show a flag's built-in default,
// not the value its variable gave it: a variable may hold a password or
// a URL with one, which must never be printed.
func (f *Flags) showDefault(name, builtin string) {
	f.FlagSet.Lookup(name).DefValue = builtin
}

// Int defines an int flag bound to env.
func (f *Flags) Int(name, env string, def int, u string) *int {
	builtin := strconv.Itoa(def)
	if v, ok := f.lookup(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not an integer", env, v))
		} else {
			def = n
		}
	}
	p := f.FlagSet.Int(name, def, usage(u, env))
	f.showDefault(name, builtin)
	return p
}

// Duration defines a duration flag bound to env.
func (f *Flags) Duration(name, env string, def time.Duration, u string) *time.Duration {
	builtin := def.String()
	if v, ok := f.lookup(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not a duration (e.g. 30s, 5m)", env, v))
		} else {
			def = d
		}
	}
	p := f.FlagSet.Duration(name, def, usage(u, env))
	f.showDefault(name, builtin)
	return p
}

// Bool defines a bool flag bound to env.
func (f *Flags) Bool(name, env string, def bool, u string) *bool {
	builtin := strconv.FormatBool(def)
	if v, ok := f.lookup(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not a boolean", env, v))
		} else {
			def = b
		}
	}
	p := f.FlagSet.Bool(name, def, usage(u, env))
	f.showDefault(name, builtin)
	return p
}

// Parse parses args and reports the first bad environment variable, if any.
// With -version it prints the build to the flag set's output and returns
// flag.ErrHelp, which a command answers by exiting 0, as it does -h.
func (f *Flags) Parse(args []string) error {
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	if *f.version {
		fmt.Fprintln(f.Output(), version.Get())
		return flag.ErrHelp
	}
	return nil
}

// Require reports a missing required value, naming its flag and variable.
func Require(value, flagName, env string) error {
	if value == "" {
		return fmt.Errorf("config: -%s (or %s) is required", flagName, env)
	}
	return nil
}
