package neo4j

import (
	"context"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

// tx is a transaction as the backend uses it: run a statement, get all of
// its records.
type tx interface {
	Run(ctx context.Context, cypher string, params map[string]any) ([]record, error)
}

// runner runs units of work in managed transactions: work may run more
// than once (a transient failure or a deadlock rolls the attempt back and
// runs it again), so it must start from scratch each time; its error rolls
// the transaction back and, unless retryable, is returned.
type runner interface {
	ExecuteWrite(ctx context.Context, work func(tx) error) error
	ExecuteRead(ctx context.Context, work func(tx) error) error
}

// driverRunner is the runner of the Neo4j driver: each call is a session
// on the database whose ExecuteWrite or ExecuteRead retries transient
// failures for up to Config.MaxRetryTime. The sessions share the driver's
// bookmark manager, so a read follows the writes before it even when a
// cluster routes it to another member.
type driverRunner struct {
	driver    neo4j.DriverWithContext
	database  string
	txTimeout time.Duration // of write transactions
}

func (r driverRunner) ExecuteWrite(ctx context.Context, work func(tx) error) error {
	return r.execute(ctx, neo4j.AccessModeWrite, work)
}

func (r driverRunner) ExecuteRead(ctx context.Context, work func(tx) error) error {
	return r.execute(ctx, neo4j.AccessModeRead, work)
}

func (r driverRunner) execute(ctx context.Context, mode neo4j.AccessMode, work func(tx) error) error {
	session := r.driver.NewSession(ctx, neo4j.SessionConfig{
		AccessMode:      mode,
		DatabaseName:    r.database,
		BookmarkManager: r.driver.ExecuteQueryBookmarkManager(),
	})
	// Closing a session returns its connection to the pool; it cannot
	// change the outcome of the transaction, so its error is dropped.
	defer func() { _ = session.Close(ctx) }()
	fn := func(mtx neo4j.ManagedTransaction) (any, error) { return nil, work(managedTx{mtx}) }
	var err error
	if mode == neo4j.AccessModeWrite {
		_, err = session.ExecuteWrite(ctx, fn, neo4j.WithTxTimeout(r.txTimeout))
	} else {
		_, err = session.ExecuteRead(ctx, fn)
	}
	return err
}

type managedTx struct{ tx neo4j.ManagedTransaction }

func (m managedTx) Run(ctx context.Context, cypher string, params map[string]any) ([]record, error) {
	result, err := m.tx.Run(ctx, cypher, params)
	if err != nil {
		return nil, err
	}
	recs, err := result.Collect(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]record, len(recs))
	for i, r := range recs {
		out[i] = r.AsMap()
	}
	return out, nil
}
