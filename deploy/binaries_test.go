package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/testenv"
)

// binaries are the commands under cmd/, built as the Dockerfile builds
// them (testenv.BuildBinaries).
type binaries struct {
	*testenv.Binaries
}

func buildBinaries(t *testing.T) *binaries {
	t.Helper()
	return &binaries{testenv.BuildBinaries(t)}
}

// help runs `name args... -h` with no CONVERGE_* variable in its
// environment, so that the defaults it prints are its own.
func (b *binaries) help(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Path(name), append(args, "-h")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.Dir}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s -h: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// cli is what one command line accepts: its flags and the environment
// variables bound to them.
type cli struct {
	name  string // "writer", "converge migrate up"
	flags map[string]bool
	envs  map[string]bool
}

var (
	helpFlag = regexp.MustCompile(`(?m)^  -([^\s=]+)`)
	helpEnv  = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)`)
	// helpNamed is a variable the help text names outside a flag's
	// "(env X)": one read from the environment alone, such as the NATS
	// password (natsauth gives it no flag, so that it is not in the
	// process list).
	helpNamed = regexp.MustCompile(`\bCONVERGE_[A-Z0-9_]*[A-Z0-9]\b`)
)

// reads reports whether the command reads env: a flag's variable, or its
// _FILE form (internal/config reads X_FILE for any X).
func (c cli) reads(env string) bool {
	if base, ok := strings.CutSuffix(env, "_FILE"); ok && c.envs[base] {
		return true
	}
	return c.envs[env]
}

func (c cli) sortedEnvs() []string {
	var out []string
	for e := range c.envs {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// cliOf reads the flags and variables of command (a binary, then for
// converge its subcommand, then flags and arguments) from its -h output,
// and returns the arguments after the binary and subcommand.
func (b *binaries) cliOf(command []string) (cli, []string, error) {
	name := command[0]
	if !slices.Contains(b.Names, name) {
		return cli{}, nil, fmt.Errorf("command %q names no binary of the image (it has %s)", strings.Join(command, " "), strings.Join(b.Names, ", "))
	}
	top, err := b.help(name)
	if err != nil {
		return cli{}, nil, err
	}
	args := command[1:]
	var sub []string
	if !strings.HasPrefix(top, "Usage of ") {
		// A command with subcommands (converge): the words before the
		// first flag name one, and it prints its own flags.
		for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			sub, args = append(sub, args[0]), args[1:]
		}
		if len(sub) == 0 {
			return cli{}, nil, fmt.Errorf("command %q names no subcommand of %s", strings.Join(command, " "), name)
		}
		// Its usage lists each subcommand ("  converge migrate up  ...").
		listed := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(name+" "+strings.Join(sub, " ")) + `(\s|$)`)
		if !listed.MatchString(top) {
			return cli{}, nil, fmt.Errorf("command %q: %s lists no subcommand %q:\n%s", strings.Join(command, " "), name, strings.Join(sub, " "), top)
		}
		if top, err = b.help(name, sub...); err != nil {
			return cli{}, nil, err
		}
	}
	if !strings.HasPrefix(top, "Usage of ") {
		return cli{}, nil, fmt.Errorf("%s -h: no flag list in its output:\n%s", strings.Join(command[:1+len(sub)], " "), top)
	}
	c := cli{name: strings.Join(command[:1+len(sub)], " "), flags: map[string]bool{}, envs: map[string]bool{}}
	for _, m := range helpFlag.FindAllStringSubmatch(top, -1) {
		c.flags[m[1]] = true
	}
	for _, m := range helpEnv.FindAllStringSubmatch(top, -1) {
		c.envs[m[1]] = true
	}
	for _, m := range helpNamed.FindAllString(top, -1) {
		c.envs[strings.TrimSuffix(m, "_FILE")] = true
	}
	if len(c.flags) == 0 || len(c.envs) == 0 {
		return cli{}, nil, fmt.Errorf("%s -h: found no flags or variables in:\n%s", c.name, top)
	}
	return c, args, nil
}

// Every binary answers -version with the build it was made from, and
// exits 0.
func TestEveryBinaryAnswersVersion(t *testing.T) {
	b := buildBinaries(t)
	for _, name := range b.Names {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, b.Path(name), "-version").CombinedOutput()
		cancel()
		line := strings.TrimSpace(string(out))
		if err != nil || !regexp.MustCompile(`^converge \S+ commit \S+( \(modified\))? go1\.\d+`).MatchString(line) {
			t.Errorf("%s -version: %v, %q; want \"converge <version> commit <commit> <go version>\"", name, err, line)
		}
	}
}
