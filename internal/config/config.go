// Package config binds command-line flags to environment variables and to
// a deployment's configuration file: every flag of every converge binary
// has a variable, and may have a key in the file (see [File]). A flag on
// the command line wins over its variable, which wins over the file, which
// wins over the built-in default. A secret variable X may instead be given
// as X_FILE, a path to read it from.
//
// Each setting's default is written once, where its flag is bound; the
// binaries, `converge dev` and `converge demo` bind the very same
// functions, and docs/configuration.md is generated from them
// (`converge config docs`).
package config

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// DefaultDataDir is -data-dir's default: where the embedded stores
	// (the index, the graph) keep their files.
	DefaultDataDir = "./.converge"
	// EnvConfig names the deployment's configuration file (-config).
	EnvConfig = "CONVERGE_CONFIG"
)

// Lookup returns the value of env, or of the file named by env_FILE
// (trailing newline removed), and whether either was set.
func Lookup(env string) (string, bool, error) { return lookupIn(os.LookupEnv, env) }

// Environ is where Flags read variables: os.LookupEnv, or what a process
// running several services gives each of them (see [NewFlagsIn]).
type Environ func(key string) (string, bool)

func lookupIn(environ Environ, env string) (string, bool, error) {
	if v, ok := environ(env); ok {
		return v, true, nil
	}
	if path, ok := environ(env + "_FILE"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false, fmt.Errorf("config: %s_FILE: %w", env, err)
		}
		return strings.TrimRight(string(b), "\r\n"), true, nil
	}
	return "", false, nil
}

// Flags wraps a FlagSet so that each flag's default comes from its
// environment variable when that is set, or else from the configuration
// file's section of the command.
type Flags struct {
	*flag.FlagSet
	errs     []error
	version  *bool
	config   *string
	section  string
	settings []Setting
	envSet   map[string]bool // flag names whose variable is set
	environ  Environ
	file     *File // read by Parse from -config
}

// Setting is one flag as bound: what `-h` and docs/configuration.md show.
type Setting struct {
	Flag    string
	Env     string // empty: a flag without a variable
	Default string // the built-in default, never a variable's value
	Usage   string
}

// NewFlags returns Flags for a command, with -version, which prints the
// build (internal/version) instead of running the command, and -config,
// the deployment's configuration file. The command reads the file's
// section [SectionOf] name.
func NewFlags(name string) *Flags { return NewFlagsIn(name, os.LookupEnv) }

// NewFlagsIn is NewFlags reading variables from environ instead of the
// process's environment: how `converge dev` gives each service it runs
// its own credentials, as a deployment gives each process its own.
func NewFlagsIn(name string, environ Environ) *Flags {
	f := &Flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), section: SectionOf(name), envSet: map[string]bool{}, environ: environ}
	f.version = f.FlagSet.Bool("version", false, "print the build (version, commit, Go version) and exit")
	f.config = f.String("config", EnvConfig, "", "the deployment's configuration file (YAML): its section "+f.section+" and its section common give the settings that neither a flag nor a variable gives")
	return f
}

// describing collects, while [Describe] runs, the Flags that commands
// parse.
var describing atomic.Pointer[describer]

type describer struct {
	mu  sync.Mutex
	got []*Flags
}

// Describe runs run, in which every Flags' Parse, instead of parsing,
// records the flags bound and returns flag.ErrHelp (which a command
// returns at once): the flags of each command run calls, for their
// documentation and for checking a configuration file. Nothing else may
// parse flags meanwhile.
func Describe(run func()) []*Flags {
	d := &describer{}
	describing.Store(d)
	defer describing.Store(nil)
	run()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.got
}

// Settings returns the flags bound so far, in order, -version excepted.
func (f *Flags) Settings() []Setting { return slices.Clone(f.settings) }

// Section is the configuration file's section this command reads.
func (f *Flags) Section() string { return f.section }

// Env is [Lookup] in the variables the flags read: what a setting without
// a flag (a password) is read with.
func (f *Flags) Env(env string) (string, bool, error) { return lookupIn(f.environ, env) }

func (f *Flags) lookup(name, env string) (string, bool) {
	if env == "" {
		return "", false
	}
	v, ok, err := f.Env(env)
	if err != nil {
		f.errs = append(f.errs, err)
	}
	if ok {
		f.envSet[name] = true
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
	if v, ok := f.lookup(name, env); ok {
		def = v
	}
	p := f.FlagSet.String(name, def, usage(u, env))
	f.showDefault(name, env, builtin, u)
	return p
}

// showDefault makes -h and a usage error show a flag's built-in default,
// not the value its variable gave it: a variable may hold a password or
// a URL with one, which must never be printed. It records the setting.
func (f *Flags) showDefault(name, env, builtin, u string) {
	f.FlagSet.Lookup(name).DefValue = builtin
	f.settings = append(f.settings, Setting{Flag: name, Env: env, Default: builtin, Usage: u})
}

// Int defines an int flag bound to env.
func (f *Flags) Int(name, env string, def int, u string) *int {
	builtin := strconv.Itoa(def)
	if v, ok := f.lookup(name, env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not an integer", env, v))
		} else {
			def = n
		}
	}
	p := f.FlagSet.Int(name, def, usage(u, env))
	f.showDefault(name, env, builtin, u)
	return p
}

// Duration defines a duration flag bound to env.
func (f *Flags) Duration(name, env string, def time.Duration, u string) *time.Duration {
	builtin := def.String()
	if v, ok := f.lookup(name, env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not a duration (e.g. 30s, 5m)", env, v))
		} else {
			def = d
		}
	}
	p := f.FlagSet.Duration(name, def, usage(u, env))
	f.showDefault(name, env, builtin, u)
	return p
}

// Bool defines a bool flag bound to env.
func (f *Flags) Bool(name, env string, def bool, u string) *bool {
	builtin := strconv.FormatBool(def)
	if v, ok := f.lookup(name, env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("config: %s=%q is not a boolean", env, v))
		} else {
			def = b
		}
	}
	p := f.FlagSet.Bool(name, def, usage(u, env))
	f.showDefault(name, env, builtin, u)
	return p
}

// Var defines a flag of value's own type (repeatable, say), without a
// variable: read from the command line and the configuration file.
func (f *Flags) Var(value flag.Value, name, u string) {
	f.FlagSet.Var(value, name, u)
	f.settings = append(f.settings, Setting{Flag: name, Default: value.String(), Usage: u})
}

// Parse parses args and reports the first bad environment variable, if any.
// With -version it prints the build to the flag set's output and returns
// flag.ErrHelp, which a command answers by exiting 0, as it does -h.
func (f *Flags) Parse(args []string) error {
	if d := describing.Load(); d != nil {
		d.mu.Lock()
		d.got = append(d.got, f)
		d.mu.Unlock()
		return flag.ErrHelp
	}
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
	if *f.config == "" {
		return nil
	}
	file, err := ReadFile(*f.config)
	if err != nil {
		return err
	}
	f.file = file
	return f.apply(file)
}

// File is the configuration file Parse read (-config), or nil.
func (f *Flags) File() *File { return f.file }

// EnvReplicas is -replicas' variable: the one replica count of every
// stream and bucket a service creates.
const EnvReplicas = "CONVERGE_REPLICAS"

// DefaultReplicas is -replicas' default, and that of every stream and
// bucket configuration left at zero: one copy.
const DefaultReplicas = 1

// envStreamReplicas is the relay's former variable of its streams'
// replicas, now -replicas'.
const envStreamReplicas = "CONVERGE_STREAM_REPLICAS"

// Replicas binds -replicas (CONVERGE_REPLICAS): how many copies of each
// stream and bucket the service creates a NATS cluster keeps (3 on a
// cluster of three). One setting for every service and every stream: a
// deployment sets it once, in the configuration file's common section or
// in every service's environment. The relay's former
// CONVERGE_STREAM_REPLICAS is refused, naming this one, rather than
// ignored: ignored, it would leave a cluster's streams with one copy.
func (f *Flags) Replicas() *int {
	if _, ok, _ := f.Env(envStreamReplicas); ok {
		f.errs = append(f.errs, fmt.Errorf("config: %s is now %s (-replicas), the one replica count of every stream and bucket", envStreamReplicas, EnvReplicas))
	}
	return f.Int("replicas", EnvReplicas, DefaultReplicas, "replicas of each stream and bucket this service creates (3 on a NATS cluster of three); the same for every service")
}

// EnvPartitions is -partitions' variable: the number of partitions of a
// deployment's documents (`converge streams apply` and the projectors,
// which must agree; the partitioned stream records it).
const EnvPartitions = "CONVERGE_PARTITIONS"

// Require reports a missing required value, naming its flag and variable.
func Require(value, flagName, env string) error {
	if value == "" {
		return fmt.Errorf("config: -%s (or %s) is required", flagName, env)
	}
	return nil
}
