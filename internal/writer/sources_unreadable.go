package writer

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ofARow reports an error a row's values cause (a value the view's
// expressions refuse: a data exception, a constraint, a subquery giving
// several rows, an exception its functions raise), rather than the view itself (a table it reads gone, a
// privilege revoked, a function that no longer exists): that row alone is
// refused, where a view that cannot be read leaves every row pending.
func ofARow(e *pgconn.PgError) bool {
	switch e.Code[:2] {
	case "21", "22", "23", "2F", "P0": // cardinality, data, constraint, a function's or PL/pgSQL's raise
		return true
	}
	return e.Code == "54000" // a limit one value exceeds (a jsonb too large, say)
}

// UnreadableSourceError is a source whose view cannot be read whatever
// the row: its changed rows stay pending in converge_inbox until it can.
type UnreadableSourceError struct {
	Source, View string
	Err          *pgconn.PgError
}

func (e *UnreadableSourceError) Error() string {
	return fmt.Sprintf("inbox: source %s: its view %s cannot be read: %s (%s); its changed rows stay pending until it can (mend what it reads, or run converge source apply)",
		e.Source, e.View, e.Err.Message, e.Err.Code)
}

func (e *UnreadableSourceError) Unwrap() error { return e.Err }
