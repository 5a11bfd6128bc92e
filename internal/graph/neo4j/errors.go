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

// Codes of the Neo4j errors that retrying cannot fix.
const (
	codeStatementPrefix            = "Neo.ClientError.Statement."
	codeConstraintValidationFailed = "Neo.ClientError.Schema.ConstraintValidationFailed"
)

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
// "Neo.TransientError.Transaction.DeadlockDetected", or "" when the server
// did not answer with one.
func (e *Error) Code() string {
	var ne *neo4j.Neo4jError
	if errors.As(e.Err, &ne) {
		return ne.Code
	}
	return ""
}

// Permanent reports whether the failure cannot clear by itself: Neo4j
// rejected a statement (Neo.ClientError.Statement.*) or found data
// violating a constraint (Neo.ClientError.Schema.ConstraintValidationFailed),
// or Apply was given invalid documents ([ErrInvalidDocs]). The projector
// runtime dead-letters such an event after its redeliveries. Everything
// else (the server down, a transaction that kept deadlocking past the
// retry time, a count fence mismatch, a wrong password being fixed) is
// retried until it clears.
func (e *Error) Permanent() bool {
	if errors.Is(e.Err, ErrInvalidDocs) {
		return true
	}
	code := e.Code()
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
// incoming ones (or whose node is gone). The transaction is rolled back.
type FenceError struct {
	Key     string
	Missing bool   // no (:Document) node of Key was found
	Have    Counts // what the graph holds
	Want    Counts // what the document has
}

func (e *FenceError) Error() string {
	if e.Missing {
		return fmt.Sprintf("count fence: document %q not found after its write", e.Key)
	}
	return fmt.Sprintf("count fence: document %q has %d HAS_CHUNK, %d LINKS_TO, %d TAGGED relationships; want %d, %d, %d",
		e.Key, e.Have.Chunks, e.Have.Links, e.Have.Tags, e.Want.Chunks, e.Want.Links, e.Want.Tags)
}

// Is makes errors.Is(err, ErrFenceMismatch) true.
func (e *FenceError) Is(target error) bool { return target == ErrFenceMismatch }
