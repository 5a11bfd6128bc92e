package neo4j

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/retry"
)

// constraint is a uniqueness constraint of the graph; its backing index
// has its name.
type constraint struct {
	name   string
	create statement
}

// constraints are what Ensure makes, in order.
var constraints = []constraint{
	{"converge_document_key", statement{"ensureDocumentKey", cypherConstraintDocumentKey, nil}},
	{"converge_chunk_id", statement{"ensureChunkID", cypherConstraintChunkID, nil}},
	{"converge_tag_name", statement{"ensureTagName", cypherConstraintTagName, nil}},
}

// States of an index, as SHOW INDEXES reports them.
const (
	indexOnline     = "ONLINE"
	indexPopulating = "POPULATING"
	indexFailed     = "FAILED"
)

// schemaIndex is what SHOW INDEXES says of the index named like a
// constraint.
type schemaIndex struct {
	found   bool
	owner   string // the owning constraint; "" for none
	state   string
	percent float64 // populated
}

// schemaAction is the step Ensure takes for a constraint whose index is in
// a given state.
type schemaAction int

const (
	actionDone       schemaAction = iota // the constraint, its index online
	actionCreate                         // nothing yet: create the constraint
	actionAwait                          // the constraint's index is populating: wait for it
	actionRecreate                       // the constraint's index failed: drop the constraint
	actionDropOrphan                     // an index of the name without its constraint: drop it
	actionForeign                        // an index of the name owned by another constraint
)

func (a schemaAction) String() string {
	return [...]string{"done", "create", "await", "recreate", "drop orphan", "foreign"}[a]
}

// nextAction is the step that an index in state ix calls for, for the
// constraint called name.
func nextAction(name string, ix schemaIndex) schemaAction {
	switch {
	case !ix.found:
		return actionCreate
	case ix.owner == name && ix.state == indexOnline:
		return actionDone
	case ix.owner == name && ix.state == indexFailed:
		return actionRecreate
	case ix.owner == name:
		return actionAwait
	case ix.owner != "":
		return actionForeign
	default:
		return actionDropOrphan
	}
}

// awaitSeconds bounds one db.awaitIndex, after which Ensure looks at the
// index again.
const awaitSeconds = 1

// maxSteps is how many steps Ensure takes for one constraint without a
// pause: drop a failed constraint, create it, wait for its index, and one
// more. A schema that still calls for steps after these (instances
// undoing each other's) is looked at again after a pause each time.
const maxSteps = 4

// schemaBackoff spaces Ensure's looks at a state it waits out.
var schemaBackoff = retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second}

// schemaPermanent reports an error of Ensure that no wait can clear: an
// index of the name that another constraint owns, data that violates the
// constraint, an index of the operator's on the same label and property,
// a missing privilege, a statement the server rejects.
func schemaPermanent(err error) bool {
	if errors.Is(err, errForeignIndex) {
		return true
	}
	switch code := neo4jCode(err); code {
	case codeConstraintValidationFailed, codeConstraintCreationFailed, codeIndexAlreadyExists, codeForbidden:
		return true
	default:
		return strings.HasPrefix(code, codeStatementPrefix)
	}
}

// Ensure makes the uniqueness constraints on Document.key, Chunk.id and
// Tag.name, each with its index online, one schema transaction per step
// (Neo4j does not mix schema and data writes in one). It converges from
// any state that a process stopped while making them (or making them
// concurrently) leaves; see the package documentation. It waits for a
// constraint to settle for up to Config.SchemaWait.
func (b *Backend) Ensure(ctx context.Context) error {
	for _, c := range constraints {
		if err := b.ensureConstraint(ctx, c); err != nil {
			return b.fail("ensure", fmt.Errorf("%s: %w", c.create.name, err))
		}
	}
	return nil
}

// ensureConstraint takes the steps that c's index calls for, looking at
// it again after each, until the constraint is there with its index
// online. A step that fails (an instance creating the same constraint got
// there first), and a state it waits out, are looked at again after a
// pause, until Config.SchemaWait has passed.
func (b *Backend) ensureConstraint(ctx context.Context, c constraint) error {
	deadline := time.Now().Add(b.cfg.SchemaWait)
	var (
		created bool // the last step was a successful create
		steps   int  // steps taken
		waits   int  // pauses made
	)
	for {
		ix, err := b.readIndex(ctx, c.name)
		if err != nil {
			err = fmt.Errorf("show indexes: %w", err)
		} else if created && !ix.found {
			// CREATE CONSTRAINT IF NOT EXISTS did nothing: an equivalent
			// constraint exists under another name.
			return nil
		} else {
			var done bool
			done, err = b.schemaStep(ctx, c, ix)
			if done {
				return nil
			}
			created = err == nil && nextAction(c.name, ix) == actionCreate
		}
		if err != nil && (ctx.Err() != nil || schemaPermanent(err)) {
			return err
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("index %s kept changing", c.name)
			}
			return fmt.Errorf("not settled within %v: %w", b.cfg.SchemaWait, err)
		}
		if err == nil && steps < maxSteps {
			steps++
			continue // a step was taken: look at what it made at once
		}
		waits++
		if err := schemaBackoff.Wait(ctx, waits); err != nil {
			return err
		}
	}
}

// schemaStep takes the step ix calls for. done reports the constraint
// settled; a nil error, that a step was taken.
func (b *Backend) schemaStep(ctx context.Context, c constraint, ix schemaIndex) (done bool, err error) {
	log := b.cfg.Logger.With("database", b.cfg.Database, "index", c.name, "state", ix.state)
	switch nextAction(c.name, ix) {
	case actionDone:
		return true, nil
	case actionCreate:
		return false, b.schemaWrite(ctx, c.create)
	case actionAwait:
		err := b.schemaWrite(ctx, statement{"awaitIndex", cypherAwaitIndex, map[string]any{"name": c.name, "seconds": int64(awaitSeconds)}})
		if err != nil {
			return false, fmt.Errorf("index %s of the constraint is %s (%.0f%%): %w", c.name, ix.state, ix.percent, err)
		}
		return false, nil
	case actionRecreate:
		log.Warn("neo4j: the constraint's index failed; dropping the constraint to create it again")
		return false, b.schemaWrite(ctx, statement{"dropConstraint", cypherDropConstraint, map[string]any{"name": c.name}})
	case actionForeign:
		return false, fmt.Errorf("index %s: %w %s", c.name, errForeignIndex, ix.owner)
	}
	// An index of the constraint's name without the constraint: one a
	// creation cut short left behind, or one whose creation still runs
	// (until the constraint commits, its index looks so). Dropping is
	// safe either way: a creation holds the schema lock that DROP INDEX
	// waits for, and once it has committed, Neo4j refuses to drop the
	// constraint's index (Neo.DatabaseError.Schema.IndexDropFailed), which
	// the next look finds settled.
	log.Warn("neo4j: an index has the constraint's name but no constraint (a creation cut short); dropping it to create the constraint")
	return false, b.schemaWrite(ctx, statement{"dropIndex", cypherDropIndex, map[string]any{"name": c.name}})
}

// readIndex reads the index called name.
func (b *Backend) readIndex(ctx context.Context, name string) (schemaIndex, error) {
	var ix schemaIndex
	err := b.run.ExecuteRead(ctx, func(t tx) error {
		ix = schemaIndex{}
		recs, err := t.Run(ctx, cypherShowIndexes, map[string]any{"names": []string{name}})
		if err != nil {
			return err
		}
		for _, r := range recs {
			var ok bool
			ix.found = true
			if ix.state, ok = r["state"].(string); !ok {
				return fmt.Errorf("index %s: state is %T", name, r["state"])
			}
			if r["owningConstraint"] != nil {
				if ix.owner, ok = r["owningConstraint"].(string); !ok {
					return fmt.Errorf("index %s: owningConstraint is %T", name, r["owningConstraint"])
				}
			}
			ix.percent, _ = r["populationPercent"].(float64)
		}
		return nil
	})
	return ix, err
}

// schemaWrite runs st alone in a write transaction.
func (b *Backend) schemaWrite(ctx context.Context, st statement) error {
	err := b.run.ExecuteWrite(ctx, func(t tx) error {
		_, err := t.Run(ctx, st.cypher, st.params)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", st.name, err)
	}
	return nil
}
