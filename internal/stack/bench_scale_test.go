package stack_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/embed/latencytest"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	envScaleEvents = "CONVERGE_BENCH_SCALE_EVENTS" // documents of each run of BenchmarkPartitionsScale

	defaultScaleEvents = 3000
	// graphScaleFactor is how many more documents the graph's runs take
	// than the index's: it applies them some ten times faster, and a run
	// of seconds would time little but its start and end.
	graphScaleFactor = 4
	scaleParts       = 8 // partitions of every run

	// The embedder: a remote endpoint answering each request after a
	// fixed latency, whatever its load. An instance sends at most
	// scaleEmbedConcurrency requests of scaleEmbedBatch chunks at once,
	// so that one instance is bound by the endpoint's latency, at
	// scaleEmbedBatch*scaleEmbedConcurrency/scaleLatency chunks/s (400),
	// far below what this machine's CPUs give it: the limit a remote
	// embedder sets, which more instances multiply.
	scaleLatency          = 20 * time.Millisecond
	scaleEmbedBatch       = 8
	scaleEmbedConcurrency = 1
	scaleDim              = 128

	// scaleTarget bounds throughput(N) / (N x throughput(1)) from below.
	scaleTarget = 0.8
)

// scaleInstances are the numbers of instances each projector is run
// with.
var scaleInstances = []int{1, 2, 4}

// indexScaleProjector is the index projector on the test Qdrant server,
// in a collection of its own (name), embedding with the endpoint at
// embedURL.
func indexScaleProjector(q testenv.Qdrant, name, embedURL string) scaleProjector {
	return scaleProjector{name: "index", binary: "projector-index",
		args: []string{"-qdrant-url", q.URL, "-qdrant-collection", name,
			"-embed-url", embedURL, "-embed-model", "fixed-latency", "-embed-dim", strconv.Itoa(scaleDim),
			"-embed-batch", strconv.Itoa(scaleEmbedBatch), "-embed-concurrency", strconv.Itoa(scaleEmbedConcurrency)},
		stored: func(ctx context.Context) (int, error) {
			return q.Count(ctx, name, map[string]any{"must": []any{map[string]any{"key": "type", "match": map[string]any{"value": "chunk"}}}})
		},
		live: func(ctx context.Context) (string, error) { return q.AliasTarget(ctx, name) },
		gone: func(ctx context.Context, c string) (bool, error) {
			exists, err := q.CollectionExists(ctx, c)
			return !exists, err
		},
	}
}

// graphScaleProjector is the graph projector on the test Neo4j server's
// instance n (emptied when leased).
func graphScaleProjector(t testing.TB, n testenv.Neo4j) scaleProjector {
	t.Helper()
	ctx := context.Background()
	driver, err := neo4j.NewDriverWithContext(n.URL, neo4j.BasicAuth(n.User, n.Password, ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = driver.Close(ctx) })
	single := func(ctx context.Context, query string) (any, error) {
		r, err := neo4j.ExecuteQuery(ctx, driver, query, nil, neo4j.EagerResultTransformer)
		if err != nil {
			return nil, err
		}
		if len(r.Records) != 1 || len(r.Records[0].Values) != 1 {
			return nil, fmt.Errorf("neo4j: %q answered %d records", query, len(r.Records))
		}
		return r.Records[0].Values[0], nil
	}
	p := scaleProjector{name: "graph", binary: "projector-graph",
		args: []string{"-neo4j-url", n.URL, "-neo4j-user", n.User},
		env:  []string{graphprojector.EnvNeo4jPassword + "=" + n.Password},
		stored: func(ctx context.Context) (int, error) {
			v, err := single(ctx, `MATCH (c:Chunk) RETURN count(c)`)
			if err != nil {
				return 0, err
			}
			c, _ := v.(int64)
			return int(c), nil
		},
	}
	// The server's own figures: its process's CPU time (its JVM's
	// OperatingSystem bean), and the number of the transaction that
	// asks, Neo4j numbering the transactions of each database in the
	// order they begin: their count so far.
	p.server = func(ctx context.Context) (serverSample, error) {
		s := serverSample{at: time.Now(), commits: -1}
		v, err := single(ctx, `CALL dbms.queryJmx("java.lang:type=OperatingSystem") YIELD attributes RETURN attributes.ProcessCpuTime.value`)
		if err != nil {
			return s, err
		}
		if ns, ok := v.(int64); ok {
			s.cpu = time.Duration(ns)
		}
		v, err = single(ctx, `SHOW TRANSACTIONS YIELD transactionId, currentQuery WHERE currentQuery STARTS WITH "SHOW TRANSACTIONS YIELD transactionId, currentQuery" RETURN transactionId`)
		if err != nil {
			return s, err
		}
		id, _ := v.(string)
		if i := strings.LastIndexByte(id, '-'); i >= 0 && strings.HasPrefix(id, "neo4j-transaction-") {
			s.commits, _ = strconv.ParseInt(id[i+1:], 10, 64)
		}
		return s, nil
	}
	return p
}

// BenchmarkPartitionsScale measures the partitioned projectors' scaling:
// the index projector on Qdrant, embedding with an endpoint of fixed
// 20 ms latency, and the graph projector on Neo4j, each with 1, 2 and 4
// instances (processes of the real binaries) sharing 8 partitions, each
// run on a fresh NATS server and a fresh collection or emptied graph,
// with the same events. The target is throughput(N) >= 0.8 x N x
// throughput(1). An instance's share of the work is its share of the
// partitions, which the members' assignment gives it (lease.Members): the
// split and the ratio it allows (8 / (N x the largest share)) are
// reported beside. For the graph, Neo4j's own figures (its process's CPU, its
// transactions/s) say where the server, not the projector, is the limit.
// Each projector first runs once, unmeasured, on a quarter of the events:
// the servers' caches and Neo4j's compiled queries are warm for all.
func BenchmarkPartitionsScale(b *testing.B) {
	n := envCount(b, envScaleEvents, defaultScaleEvents)
	bin := testenv.BuildBinaries(b)
	evs := scaleEvents(n)
	b.Logf("%d documents (%d chunks), %d partitions, on %d CPUs (this machine's figures)", n, countChunks(evs), scaleParts, runtime.NumCPU())
	b.Run("index", func(b *testing.B) {
		q := testenv.LeaseQdrant(b)
		embedder := latencytest.Start(b, scaleLatency, scaleDim)
		b.Logf("the embedder: %v per request, %d chunks a request, %d request(s) in flight per instance: one instance is bound at %.0f chunks/s by the latency",
			scaleLatency, scaleEmbedBatch, scaleEmbedConcurrency, float64(scaleEmbedBatch*scaleEmbedConcurrency)/scaleLatency.Seconds())
		benchScale(b, "index projector on Qdrant, 20 ms embedder", fmt.Sprintf(">= %.1f", scaleTarget), func(b *testing.B, run int) scaleProjector {
			return indexScaleProjector(q, fmt.Sprintf("%s_%d", q.Collection, run), embedder.URL)
		}, bin, evs)
		b.Logf("the embedder answered %d requests, at most %d at once", embedder.Requests(), embedder.PeakInFlight())
	})
	b.Run("graph", func(b *testing.B) {
		evs := scaleEvents(n * graphScaleFactor)
		b.Logf("%d documents (%d chunks)", len(evs), countChunks(evs))
		benchScale(b, "graph projector on Neo4j", fmt.Sprintf(">= %.1f below Neo4j's saturation", scaleTarget), func(b *testing.B, _ int) scaleProjector {
			return graphScaleProjector(b, testenv.LeaseNeo4j(b))
		}, bin, evs)
	})
}

// benchScale runs the projector that store makes with each number of
// instances, a sub-benchmark each, and reports the ratios against goal.
func benchScale(b *testing.B, what, goal string, store func(b *testing.B, run int) scaleProjector, bin *testenv.Binaries, evs []contract.Event) {
	var one scaleResult
	run := 0
	b.Run("warm-up", func(b *testing.B) {
		run++
		runScale(b, bin, store(b, run), evs[:len(evs)/4], scaleOptions{instances: 1, parts: scaleParts})
	})
	for _, instances := range scaleInstances {
		b.Run(fmt.Sprintf("instances=%d", instances), func(b *testing.B) {
			var r scaleResult
			for range b.N {
				run++
				r = runScale(b, bin, store(b, run), evs, scaleOptions{instances: instances, parts: scaleParts})
			}
			if instances == 1 {
				one = r
			}
			b.ReportMetric(r.eventsPerSec(), "events/s")
			b.ReportMetric(r.chunksPerSec(), "chunks/s")
			line := fmt.Sprintf("%s, %d instance(s): %.0f events/s, %.0f chunks/s in %v (the server fed the partitioned stream in %v); split %v, applied %v; CPU: the instances %.2f cores, the benchmark's process (NATS, the embeddings endpoint) %.2f, the machine busy %.2f of %d (all processes)",
				what, instances, r.eventsPerSec(), r.chunksPerSec(), r.elapsed.Round(time.Millisecond), r.fill.Round(time.Millisecond),
				r.split, r.applied, r.instanceCPU.Seconds()/r.elapsed.Seconds(), r.ownCPU.Seconds()/r.elapsed.Seconds(), r.machineBusy, runtime.NumCPU())
			line += fmt.Sprintf("; batches retried after a transient store error: %d", r.retries)
			if r.serverCPU >= 0 || r.serverTxPerSec > 0 {
				line += fmt.Sprintf("; Neo4j's own figures: CPU %.2f cores, %.0f transactions/s (%.1f events each)", r.serverCPU, r.serverTxPerSec, r.eventsPerSec()/r.serverTxPerSec)
			}
			if one.elapsed > 0 && instances > 1 {
				ratio := r.eventsPerSec() / (float64(instances) * one.eventsPerSec())
				bound := float64(scaleParts) / float64(instances*r.maxShare())
				verdict := "MET"
				if ratio < scaleTarget {
					verdict = "MISSED"
				}
				b.ReportMetric(ratio, "ratio")
				b.ReportMetric(bound, "split_bound")
				line += fmt.Sprintf("; ratio %.3f (target >= %.1f: %s), the split allows %.3f", ratio, scaleTarget, verdict, bound)
				benchsummary.Log(b, benchsummary.Row{Target: fmt.Sprintf("%s, %d instances / %d x one", what, instances, instances),
					Figure: fmt.Sprintf("%.0f events/s", r.eventsPerSec()), Limit: fmt.Sprintf("%d x %.0f events/s", instances, one.eventsPerSec()),
					Ratio: ratio, Goal: goal, Met: ratio >= scaleTarget})
			}
			if len(r.restarts) > 0 {
				line += fmt.Sprintf("; instances that exited while the partitions were being shared, and were started again: %s", strings.Join(r.restarts, "; "))
			}
			b.Log(line)
		})
	}
}

// TestPartitionsScaleShort runs the scaling benchmark's index projector
// on a few events, with one instance and then two: every event is applied
// once, by the instance holding its partition, both instances write, and
// Qdrant holds every chunk; the two instances then rebuild the index
// blue/green, asked of one of them. The ratio is printed, not checked:
// this is not a measurement (BenchmarkPartitionsScale is).
func TestPartitionsScaleShort(t *testing.T) {
	const events, parts = 80, 4
	bin := testenv.BuildBinaries(t)
	q := testenv.LeaseQdrant(t)
	embedder := latencytest.Start(t, scaleLatency, scaleDim)
	evs := scaleEvents(events)
	var one scaleResult
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprintf("instances=%d", instances), func(t *testing.T) {
			// Two instances then rebuild the index blue/green.
			r := runScale(t, bin, indexScaleProjector(q, fmt.Sprintf("%s_%d", q.Collection, instances), embedder.URL), evs,
				scaleOptions{instances: instances, parts: parts, everyInstanceHolds: true, rebuild: instances == 2})
			for i, n := range r.applied {
				if r.split[i] > 0 && n == 0 {
					t.Errorf("instance %d holds %d partitions and applied nothing", i+1, r.split[i])
				}
			}
			if instances == 1 {
				one = r
				t.Logf("1 instance: %.0f events/s, %.0f chunks/s", r.eventsPerSec(), r.chunksPerSec())
				return
			}
			ratio := 0.0
			if one.elapsed > 0 {
				ratio = r.eventsPerSec() / (float64(instances) * one.eventsPerSec())
			}
			if len(r.restarts) > 0 {
				t.Logf("instances that exited while the partitions were being shared, and were started again: %s", strings.Join(r.restarts, "; "))
			}
			t.Logf("%d instances: %.0f events/s, %.0f chunks/s, split %v, applied %v; ratio %.2f (printed only: a short run on a shared machine measures nothing)",
				instances, r.eventsPerSec(), r.chunksPerSec(), r.split, r.applied, ratio)
		})
	}
}

func countChunks(evs []contract.Event) int {
	n := 0
	for _, ev := range evs {
		n += len(ev.Chunks)
	}
	return n
}
