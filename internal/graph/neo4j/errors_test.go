package neo4j

import (
	"errors"
	"fmt"
	"testing"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/projector"
)

func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		cause error
		want  bool
	}{
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Statement.SyntaxError"}, true},
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Statement.TypeError"}, true},
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Statement.ParameterMissing"}, true},
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Schema.ConstraintValidationFailed"}, true},
		{fmt.Errorf("mergeLinks: %w", &neo4j.Neo4jError{Code: "Neo.ClientError.Statement.SemanticError"}), true},
		{fmt.Errorf("%w: key %q appears twice", ErrInvalidDocs, "a"), true},
		{&neo4j.Neo4jError{Code: "Neo.TransientError.Transaction.DeadlockDetected"}, false},
		// A concurrent delete: the next attempt does not meet the entity.
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Statement.EntityNotFound"}, false},
		{fmt.Errorf("writeDocuments: 1 documents: %w: %w", ErrTooLarge,
			&neo4j.Neo4jError{Code: "Neo.TransientError.General.MemoryPoolOutOfMemoryError"}), true},
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Security.Unauthorized"}, false},
		{&neo4j.Neo4jError{Code: "Neo.ClientError.Database.DatabaseNotFound"}, false},
		{&neo4j.Neo4jError{Code: "Neo.DatabaseError.General.UnknownError"}, false},
		{&neo4j.ConnectivityError{Inner: errors.New("connection refused")}, false},
		{&neo4j.TransactionExecutionLimit{Cause: "timeout"}, false},
		{&FenceError{Key: "a", Have: Counts{Chunks: 1}, Want: Counts{Chunks: 2}}, false},
		{errors.New("anything else"), false},
	} {
		err := error(&Error{Op: "apply", Database: "neo4j", Err: c.cause})
		if got := projector.IsPermanent(err); got != c.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", err, got, c.want)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	err := &Error{Op: "apply", Database: "graph", Err: &FenceError{Key: "doc/1", Have: Counts{2, 1, 0}, Want: Counts{3, 1, 0}}}
	want := `neo4j: apply on database "graph": count fence: document "doc/1" has 2 HAS_CHUNK, 1 LINKS_TO, 0 TAGGED relationships; want 3, 1, 0`
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
	limit := &neo4j.TransactionExecutionLimit{Cause: "timeout", Errors: []error{
		&neo4j.Neo4jError{Code: "Neo.TransientError.General.MemoryPoolOutOfMemoryError"},
		&neo4j.Neo4jError{Code: "Neo.TransientError.Transaction.DeadlockDetected"},
	}}
	if got := (&Error{Err: fmt.Errorf("wipe: %w", limit)}).Code(); got != "Neo.TransientError.Transaction.DeadlockDetected" {
		t.Errorf("Code of a retried transaction = %q, want its last attempt's", got)
	}
	if (&Error{Err: errors.New("x")}).Code() != "" {
		t.Error("Code of a non-Neo4j error is not empty")
	}
}

// Only a transaction past the memory bound is split; a timed-out one is
// retried whole (with the lock order it may have waited for locks), so
// contention never splits a batch down to a dead-lettered document.
func TestTooLarge(t *testing.T) {
	for code, want := range map[string]bool{
		"Neo.TransientError.General.MemoryPoolOutOfMemoryError":              true,
		"Neo.ClientError.General.TransactionOutOfMemoryError":                true,
		"Neo.ClientError.Transaction.TransactionTimedOut":                    false,
		"Neo.ClientError.Transaction.TransactionTimedOutClientConfiguration": false,
		"Neo.TransientError.Transaction.DeadlockDetected":                    false,
	} {
		if got := tooLarge(fmt.Errorf("writeDocuments: %w", &neo4j.Neo4jError{Code: code})); got != want {
			t.Errorf("tooLarge(%s) = %v, want %v", code, got, want)
		}
	}
}
