package neo4j

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/graph"
)

// countingRunner counts the attempts of the write transactions it runs
// (the driver's managed transactions run a unit of work again after a
// transient failure) and the failures of attempts, by Neo4j status code.
type countingRunner struct {
	runner
	attempts atomic.Int64
	mu       sync.Mutex
	failures map[string]int
}

func newCountingRunner(r runner) *countingRunner {
	return &countingRunner{runner: r, failures: map[string]int{}}
}

func (c *countingRunner) ExecuteWrite(ctx context.Context, work func(tx) error) error {
	return c.runner.ExecuteWrite(ctx, func(t tx) error {
		c.attempts.Add(1)
		err := work(t)
		if err != nil {
			c.mu.Lock()
			c.failures[(&Error{Err: err}).Code()]++
			c.mu.Unlock()
		}
		return err
	})
}

func (c *countingRunner) failed(code string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures[code]
}

// shardDocs are version v of the documents of shard s of n, as the
// projector's parallel shards write them: keys of their own, each
// document linking to documents of the other shards (which link back)
// and tagged with tags every shard uses. Version 2 links elsewhere, so
// its write deletes relationships to other shards' documents too.
func shardDocs(s, n, perShard int, v int64) []graph.Doc {
	docs := make([]graph.Doc, perShard)
	for i := range docs {
		var links []string
		for j := 1; j <= 3; j++ {
			links = append(links, fmt.Sprintf("s%d-%04d", (s+j)%n, (i*7+j*13+int(v)*5)%perShard))
		}
		docs[i] = doc(fmt.Sprintf("s%d-%04d", s, i), v, 2, links, []string{"common", fmt.Sprint("t", (i+int(v))%5)})
	}
	return docs
}

// Parallel shards writing disjoint documents that link each other's and
// share tags: every transaction takes its node locks in one order, so
// they wait for each other but never deadlock. Without that order, the
// relationship writes locked their end nodes in opposite orders, and the
// server answered DeadlockDetected; each deadlock cost a retry after the
// driver's backoff (a second and more), and the load ran several times
// slower than one shard alone.
func TestConcurrentShardsDoNotDeadlock(t *testing.T) {
	const shards, perShard, call = 4, 200, 50
	b := newServerBackend(t, Config{BatchSize: call, MaxRetryTime: 15 * time.Second})
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	counts := newCountingRunner(b.run)
	b.run = counts
	start := time.Now()
	for v := int64(1); v <= 2; v++ {
		var wg sync.WaitGroup
		errs := make([]error, shards)
		for s := range shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				docs := shardDocs(s, shards, perShard, v)
				for i := 0; i < len(docs) && errs[s] == nil; i += call {
					_, errs[s] = b.Apply(ctx(), docs[i:i+call])
				}
			}()
		}
		wg.Wait()
		for s, err := range errs {
			if err != nil {
				t.Errorf("version %d, shard %d: %v", v, s, err)
			}
		}
	}
	txs := int64(2 * shards * perShard / call)
	t.Logf("%d shards x %d documents, twice, in %d transactions: %v, %d attempts, failed attempts by code %v",
		shards, perShard, txs, time.Since(start).Round(time.Millisecond), counts.attempts.Load(), counts.failures)
	if n := counts.failed("Neo.TransientError.Transaction.DeadlockDetected"); n > 0 {
		t.Errorf("%d attempts deadlocked", n)
	}
	n := 0
	err := b.ScanDocuments(ctx(), func(v graph.View) error {
		n++
		if v.Stub || v.Version != 2 || len(v.Links) != 3 || len(v.Tags) != 2 || len(v.Chunks) != 2 {
			return fmt.Errorf("%s = %+v, want version 2 with 3 links, 2 tags, 2 chunks", v.Key, v)
		}
		return nil
	})
	if err != nil || n != shards*perShard {
		t.Fatalf("scanned %d documents (%v), want %d", n, err, shards*perShard)
	}
}
