package pgcluster

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrBinariesNotFound reports that no directory holding initdb, pg_ctl and
	// postgres was found. Errors returned by Start wrap it together with the
	// list of places searched and how to fix it.
	ErrBinariesNotFound = errors.New("pgcluster: PostgreSQL server binaries not found")

	// ErrNoPostgresUser reports that the process runs as root but there is no
	// "postgres" OS user to run the server as.
	ErrNoPostgresUser = errors.New(`pgcluster: running as root but OS user "postgres" does not exist (install postgresql-15, which creates it, or run as a non-root user)`)

	// ErrRemoved reports an operation on a cluster whose directory was
	// already removed by Stop.
	ErrRemoved = errors.New("pgcluster: cluster was stopped and its directory removed")
)

// binariesNotFound builds the user-facing error for a failed lookup.
func binariesNotFound(looked []string) error {
	where := "nowhere"
	if len(looked) > 0 {
		where = strings.Join(looked, ", ")
	}
	return fmt.Errorf("%w (looked in %s): install postgresql-15 (apt-get install postgresql-15) or set CONVERGE_PG_BINDIR",
		ErrBinariesNotFound, where)
}

// StartError reports a failure to initialise or start the server. LogTail
// holds the last lines of the server log, which usually name the cause.
type StartError struct {
	Op      string // "initdb", "start", "ready"
	Port    int
	Err     error
	LogTail string
}

func (e *StartError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pgcluster: %s (port %d): %v", e.Op, e.Port, e.Err)
	if tail := strings.TrimSpace(e.LogTail); tail != "" {
		b.WriteString("\nserver log tail:\n")
		b.WriteString(tail)
	}
	return b.String()
}

func (e *StartError) Unwrap() error { return e.Err }
