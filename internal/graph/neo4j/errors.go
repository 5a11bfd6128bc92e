package neo4j

import (
	"errors"
	"fmt"
	"strings"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

// ErrInvalidDocs is matched by the error of an Apply given documents it
// cannot write: an empty or repeated key, an empty link or tag, a missing
// or repeated chunk id. Sending them again cannot succeed.
var ErrInvalidDocs = errors.New("invalid documents")

// ErrFenceMismatch is matched by every [*FenceError].
var ErrFenceMismatch = errors.New("count fence mismatch")

// ErrTooLarge is matched by the error of a transaction that exceeded the
// server's memory bound for one transaction. Apply splits such a
// batch in halves and tries again; a single document too large fails with
// it, permanently.
var ErrTooLarge = errors.New("too large for one transaction")

// errForeignIndex is an index named like a constraint of converge that
// another constraint owns; Ensure does not touch it.
var errForeignIndex = errors.New("the index belongs to another constraint")

// Codes of the Neo4j errors that retrying cannot fix.
const (
	codeStatementPrefix            = "Neo.ClientError.Statement."
	codeConstraintValidationFailed = "Neo.ClientError.Schema.ConstraintValidationFailed"
	// Of a schema change: data that violates the constraint, an index
	// of the operator's on the same label and property, a missing
	// privilege.
	codeConstraintCreationFailed = "Neo.DatabaseError.Schema.ConstraintCreationFailed"
	codeIndexAlreadyExists       = "Neo.ClientError.Schema.IndexAlreadyExists"
	codeForbidden                = "Neo.ClientError.Security.Forbidden"
	// A statement that met an entity a concurrent transaction deleted:
	// the next attempt does not meet it.
	codeEntityNotFound = "Neo.ClientError.Statement.EntityNotFound"
)

// Codes of a transaction that went past the memory bound of the server
// (db.memory.transaction.max, or the pool of all transactions). The server
// calls the first transient, but the same transaction fails the same way
// again: only a smaller one can pass. A transaction timeout is not among
// them: with the lock order, transactions wait for each other's locks, so
// a timeout says little about the size of a batch, and splitting it down to
// a dead-lettered document would drop an event for contention.
var codesTooLarge = map[string]bool{
	"Neo.TransientError.General.MemoryPoolOutOfMemoryError": true,
	"Neo.ClientError.General.TransactionOutOfMemoryError":   true,
}

// tooLarge reports whether err is a transaction past the server's bounds.
func tooLarge(err error) bool { return codesTooLarge[neo4jCode(err)] }

// neo4jCode is the status code of err's *neo4j.Neo4jError, looking into
// the last attempt of a retried transaction that gave up
// (*neo4j.TransactionExecutionLimit keeps its attempts' errors without
// unwrapping to them), or "".
func neo4jCode(err error) string {
	var ne *neo4j.Neo4jError
	if errors.As(err, &ne) {
		return ne.Code
	}
	var limit *neo4j.TransactionExecutionLimit
	if errors.As(err, &limit) && len(limit.Errors) > 0 {
		return neo4jCode(limit.Errors[len(limit.Errors)-1])
	}
	return ""
}

// Error is a failed operation of the [Backend]. It keeps the driver's error
// (a *neo4j.Neo4jError, a connectivity error, ...) or a [*FenceError] as
// its cause.
type Error struct {
	Op       string // what the backend was doing, e.g. "apply"
	Database string
	Err      error
}

func (e *Error) Error() string {
	return fmt.Sprintf("neo4j: %s on database %q: %v", e.Op, e.Database, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Code is the Neo4j status code of the failure, such as
// "Neo.TransientError.Transaction.DeadlockDetected" (of the last attempt
// when the driver stopped retrying), or "" when the server did not
// answer with one.
func (e *Error) Code() string { return neo4jCode(e.Err) }

// Permanent reports whether the failure cannot clear by itself: Neo4j
// rejected a statement (Neo.ClientError.Statement.*, but for
// EntityNotFound, which a concurrent delete causes) or found data
// violating a constraint (Neo.ClientError.Schema.ConstraintValidationFailed),
// a single document is too large for one transaction ([ErrTooLarge]), or
// Apply was given invalid documents ([ErrInvalidDocs]). The projector
// runtime dead-letters such an event after its redeliveries. Everything
// else (the server down, a transaction that kept deadlocking past the
// retry time, a count fence mismatch, a wrong password being fixed) is
// retried until it clears.
func (e *Error) Permanent() bool {
	if errors.Is(e.Err, ErrInvalidDocs) || errors.Is(e.Err, ErrTooLarge) {
		return true
	}
	code := e.Code()
	if code == codeEntityNotFound {
		return false
	}
	return strings.HasPrefix(code, codeStatementPrefix) || code == codeConstraintValidationFailed
}

// Counts are a document's relationships of each type.
type Counts struct {
	Chunks int // HAS_CHUNK
	Links  int // LINKS_TO
	Tags   int // TAGGED
}

// FenceError is the count fence finding, after the writes of a
// transaction, a document whose relationships are not exactly the
// incoming ones. The transaction is rolled back. (A document the write
// statement does not answer for at all is another error: the statement
// MERGEs every row's node, so it cannot be gone.)
type FenceError struct {
	Key  string
	Have Counts // what the graph holds
	Want Counts // what the document has
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("count fence: document %q has %d HAS_CHUNK, %d LINKS_TO, %d TAGGED relationships; want %d, %d, %d",
		e.Key, e.Have.Chunks, e.Have.Links, e.Have.Tags, e.Want.Chunks, e.Want.Links, e.Want.Tags)
}

// Is makes errors.Is(err, ErrFenceMismatch) true.
func (e *FenceError) Is(target error) bool { return target == ErrFenceMismatch }
