package pgcluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// EnvBinDir names the environment variable that overrides binary lookup.
const EnvBinDir = "CONVERGE_PG_BINDIR"

// requiredBinaries are the programs a cluster needs; a directory is only
// accepted when it has all of them, so a client-only install is skipped.
var requiredBinaries = []string{"initdb", "pg_ctl", "postgres"}

// debianGlob is where Debian/Ubuntu install versioned server binaries.
var debianGlob = "/usr/lib/postgresql/*/bin"

// FindBinDir returns the directory holding the PostgreSQL server binaries.
// explicit (Config.BinDir) and $CONVERGE_PG_BINDIR are authoritative: when
// set but wrong, the lookup fails instead of silently using another version.
func FindBinDir(explicit string) (string, error) {
	if explicit != "" {
		if hasBinaries(explicit) {
			return explicit, nil
		}
		return "", binariesNotFound([]string{explicit + " (Config.BinDir)"})
	}
	if env := os.Getenv(EnvBinDir); env != "" {
		if hasBinaries(env) {
			return env, nil
		}
		return "", binariesNotFound([]string{env + " ($" + EnvBinDir + ")"})
	}

	var looked []string
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, pgConfig, "--bindir").Output()
		cancel()
		if err == nil {
			dir := strings.TrimSpace(string(out))
			if hasBinaries(dir) {
				return dir, nil
			}
			looked = append(looked, dir+" (pg_config --bindir)")
		}
	} else {
		looked = append(looked, "pg_config on $PATH (not found)")
	}

	// Fedora, Homebrew and similar put initdb on $PATH, often as a symlink
	// into a versioned directory that also holds postgres.
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = real
		}
		dir := filepath.Dir(initdb)
		if hasBinaries(dir) {
			return dir, nil
		}
		looked = append(looked, dir+" (initdb on $PATH)")
	}

	dirs, _ := filepath.Glob(debianGlob)
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	looked = append(looked, debianGlob)
	return "", binariesNotFound(looked)
}

func hasBinaries(dir string) bool {
	for _, name := range requiredBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionOf extracts the major version from /usr/lib/postgresql/<v>/bin so
// that 15 sorts above 9.6; unparsable names sort last.
func versionOf(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return -1
	}
	return v
}
