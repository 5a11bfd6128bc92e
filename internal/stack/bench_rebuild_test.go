// The rebuild benchmarks of `make bench`: each projection rebuilt from a
// stream filled directly, not through Postgres.

package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	gembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/index"
	iembedded "github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/projector"
	rebuildpkg "github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	envRebuildDocs     = "CONVERGE_BENCH_REBUILD_DOCS" // documents of the rebuild
	defaultRebuildDocs = 100000

	rebuildTargetDocs = 100000
	rebuildTarget     = 60 * time.Second
)

// BenchmarkRebuildIndex times a rebuild: a fresh projector runtime
// converging an empty store to a stream of rebuildDocs events from its
// start, for the embedded index (hash embedder) and for the embedded
// graph. The stream is filled directly, not through Postgres: the point is
// the projector.
func BenchmarkRebuildIndex(b *testing.B) {
	n := envCount(b, envRebuildDocs, defaultRebuildDocs)
	ctx := context.Background()
	ns, err := natsserver.Start(b.TempDir(), -1)
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var refused error // a publish the stream refused
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			refused = errors.Join(refused, err)
			mu.Unlock()
		}))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	fillStart := time.Now()
	chunks, size := fillStream(ctx, b, js, n)
	mu.Lock()
	if refused != nil {
		b.Fatalf("filling the stream: %v", refused)
	}
	mu.Unlock()
	filled := fmt.Sprintf("stream CONVERGE_DOCS filled with %d events (%.2f chunks a document, %.0f bytes an event) in %v",
		n, float64(chunks)/float64(n), float64(size)/float64(n), time.Since(fillStart).Round(time.Millisecond))
	// A benchmark with sub-benchmarks prints no log of its own.
	var once sync.Once

	runs := 0
	// project converges store to the whole stream with a fresh projector
	// runtime (a consumer of its own, deleted afterwards).
	project := func(b *testing.B, what string, store projector.Store) {
		runs++
		name := fmt.Sprintf("rebuild-%s-%d", what, runs)
		r, err := projector.New(js, store, projector.Config{Name: name, StopWhenCaughtUp: true}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Run(ctx); err != nil {
			b.Fatal(err)
		}
		if err := js.DeleteConsumer(ctx, contract.DocsStream, name); err != nil {
			b.Fatal(err)
		}
	}
	rebuild := func(b *testing.B, what string, open func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error)) {
		once.Do(func() { b.Log(filled) })
		var took time.Duration
		for range b.N {
			start := time.Now()
			store, count, closeStore := open(b)
			project(b, what, store)
			took += time.Since(start)
			got, err := count(ctx)
			if err != nil || got != n {
				b.Fatalf("after the rebuild the %s holds %d documents (%v), want %d", what, got, err, n)
			}
			if err := closeStore(); err != nil {
				b.Fatal(err)
			}
		}
		reportRebuild(b, "rebuild of the embedded "+what, n, took)
	}
	b.Run("index", func(b *testing.B) {
		rebuild(b, "index", func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error) {
			e, err := embed.New(embed.Config{})
			if err != nil {
				b.Fatal(err)
			}
			st, err := iembedded.Open(b.TempDir(), iembedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			x, err := index.New(ctx, st, e, index.Options{})
			if err != nil {
				b.Fatal(err)
			}
			count := func(ctx context.Context) (int, error) {
				docs, err := verify.ReadIndex(ctx, st)
				return len(docs), err
			}
			return x, count, st.Close
		})
	})
	// The whole rebuild as converge rebuild index runs it in the projector
	// process: a fresh generation filled by the rebuild consumer, the switch,
	// the previous generation dropped.
	b.Run("index-blue-green", func(b *testing.B) {
		once.Do(func() { b.Log(filled) })
		var took time.Duration
		for range b.N {
			dataDir := b.TempDir()
			stores, err := indexprojector.NewStores(ctx, &indexprojector.Config{DataDir: dataDir}, index.Options{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			sw, rebuilt, stop := rebuildWithManager(ctx, b, js, stores, "index", "bench-index")
			took += rebuilt
			x := sw.Live().Store.(*index.Index)
			docs, err := verify.ReadIndex(ctx, x.Backend().(index.Backend))
			if err != nil || len(docs) != n || sw.Live().Name == "index" {
				b.Fatalf("after the rebuild the live generation %s holds %d documents (%v), want %d in a fresh one", sw.Live().Name, len(docs), err, n)
			}
			stop()
			_ = sw.Close()
			_ = stores.Close()
		}
		reportRebuild(b, "blue/green rebuild (fill, switch, drop) of the embedded index", n, took)
	})
	b.Run("graph", func(b *testing.B) {
		rebuild(b, "graph", func(b *testing.B) (projector.Store, func(context.Context) (int, error), func() error) {
			st, err := gembedded.Open(b.TempDir(), gembedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			p, err := graph.New(ctx, st)
			if err != nil {
				b.Fatal(err)
			}
			count := func(ctx context.Context) (int, error) {
				docs, err := verify.ReadGraph(ctx, st)
				return len(docs), err
			}
			return p, count, st.Close
		})
	})
	// The graph in Neo4j (the project's test server): first the projector
	// runtime filling an emptied database from the stream's start, then the
	// rebuild as converge rebuild graph runs it there, in place: the wipe of
	// the full graph, the fill, the activation.
	b.Run("graph-neo4j", func(b *testing.B) {
		once.Do(func() { b.Log(filled) })
		n4 := testenv.LeaseNeo4j(b)
		cfg := graphprojector.Config{Neo4jURL: n4.URL, Neo4jUser: n4.User, Neo4jPassword: n4.Password, Neo4jDatabase: "neo4j",
			Neo4jBatch: 100}
		var fill, rebuilt time.Duration
		for range b.N {
			backend, err := neo4j.New(ctx, neo4j.Config{URL: n4.URL, User: n4.User, Password: n4.Password})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := backend.Wipe(ctx); err != nil {
				b.Fatal(err)
			}
			p, err := graph.New(ctx, backend)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			project(b, "graph-neo4j", p)
			fill += time.Since(start)
			if docs, err := verify.ReadGraph(ctx, backend); err != nil || len(docs) != n {
				b.Fatalf("after the fill Neo4j holds %d documents (%v), want %d", len(docs), err, n)
			}
			_ = backend.Close()

			c := cfg
			c.DataDir = b.TempDir()
			stores := graphprojector.NewStores(&c, nil)
			sw, took, stop := rebuildWithManager(ctx, b, js, stores, "neo4j", "bench-graph")
			rebuilt += took
			g := sw.Live().Store.(*graph.Projection)
			if docs, err := verify.ReadGraph(ctx, g.Backend()); err != nil || len(docs) != n {
				b.Fatalf("after the rebuild in place Neo4j holds %d documents (%v), want %d", len(docs), err, n)
			}
			stop()
			_ = sw.Close()
		}
		per := fill / time.Duration(b.N)
		b.ReportMetric(float64(n)/per.Seconds(), "fill_docs/s")
		b.Logf("the projector runtime filling an empty Neo4j from %d events: %v, %.0f docs/s (absolute, this machine)",
			n, per.Round(time.Millisecond), float64(n)/per.Seconds())
		reportRebuild(b, "rebuild in place (wipe of the full graph, fill) of the graph in Neo4j", n, rebuilt)
	})
}

// rebuildWithManager runs one whole rebuild as a projector process does:
// a rebuild.Manager over stores, whose live generation is live, started
// as soon as it takes a rebuild and waited for until done. It returns the
// switch (with the rebuilt generation live), how long the rebuild took,
// and stop, which ends the manager.
func rebuildWithManager(ctx context.Context, b *testing.B, js jetstream.JetStream, stores rebuildpkg.Stores, live, name string) (*rebuildpkg.Switch, time.Duration, func()) {
	b.Helper()
	g, err := stores.Open(ctx, live)
	if err != nil {
		b.Fatal(err)
	}
	sw := rebuildpkg.NewSwitch(g)
	m, err := rebuildpkg.NewManager(rebuildpkg.Config{Runtime: projector.Config{Name: name}}, stores, sw, nil)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(runCtx, js) }()
	start := time.Now()
	for {
		if _, _, err := m.Start(ctx); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // the manager is still connecting
	}
	lastErr, phase, phaseAt := "", "", start
	for st := m.Status(ctx); ; st = m.Status(ctx) {
		if st.Phase != phase {
			// Where a rebuild's time goes: each phase's share, in the log.
			if phase != "" {
				b.Logf("rebuild %s: phase %s took %v", name, phase, time.Since(phaseAt).Round(time.Millisecond))
			}
			phase, phaseAt = st.Phase, time.Now()
		}
		if st.Phase == rebuildpkg.PhaseDone {
			break
		}
		if st.Error != "" && st.Error != lastErr {
			b.Logf("rebuild: %s", st.Error)
			lastErr = st.Error
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	return sw, took, func() { cancel(); <-done }
}

// reportRebuild reports the rebuilds of n documents that took took over
// b.N runs, against the target for rebuildTargetDocs.
func reportRebuild(b *testing.B, what string, n int, took time.Duration) {
	b.Helper()
	per := took / time.Duration(b.N)
	rate := float64(n) / per.Seconds()
	projected := time.Duration(float64(rebuildTargetDocs) / rate * float64(time.Second))
	verdict := "met"
	if projected >= rebuildTarget {
		verdict = "NOT MET"
	}
	b.ReportMetric(per.Seconds(), "rebuild_s")
	b.ReportMetric(rate, "docs/s")
	b.Logf("%s from %d events: %v, %.0f docs/s; %d documents take %v at this rate; target < %v for %d: %s (%.2f of the target)",
		what, n, per.Round(time.Millisecond), rate, rebuildTargetDocs, projected.Round(time.Millisecond), rebuildTarget, rebuildTargetDocs,
		verdict, projected.Seconds()/rebuildTarget.Seconds())
	benchsummary.Log(b, benchsummary.Row{Target: fmt.Sprintf("%s, %d documents", what, rebuildTargetDocs),
		Figure: projected.Round(100 * time.Millisecond).String(), Limit: rebuildTarget.String(), Ratio: projected.Seconds() / rebuildTarget.Seconds(),
		Goal: "< 1", Met: projected < rebuildTarget})
}

// fillStream publishes n upserted events of ~1 KB documents (one or two
// chunks by the writer's chunker, two or three links, two tags)
// asynchronously, as the relay does (Nats-Msg-Id = the event id), and
// returns the number of chunks and of encoded bytes. A publish the stream
// refuses goes to js's error handler.
func fillStream(ctx context.Context, b *testing.B, js jetstream.JetStream, n int) (chunks, size int) {
	b.Helper()
	words := strings.Fields("river delta glacier forest coral reef bird nest compiler parser token network packet router " +
		"telescope mirror comet orbit harbour pier crane ship cargo lava magma crater basalt canopy fern moss")
	for i := range n {
		rng := rand.New(rand.NewPCG(uint64(i), 7)) //nolint:gosec // reproducible text, not a secret
		var body strings.Builder
		want := 700 + rng.IntN(700) // one chunk below the chunker's 1024-byte target, two above
		for body.Len() < want {
			for range 10 + rng.IntN(10) {
				body.WriteString(words[rng.IntN(len(words))])
				body.WriteByte(' ')
			}
			body.WriteString(strconv.Itoa(i))
			body.WriteString(".\n\n")
		}
		key := fmt.Sprintf("rebuild/%07d", i)
		links := []string{fmt.Sprintf("rebuild/%07d", (i+1)%n), fmt.Sprintf("rebuild/%07d", rng.IntN(n))}
		if i%3 == 0 {
			links = append(links, fmt.Sprintf("external/%d", i%500))
		}
		d, err := contract.Document{Key: key, Version: 1, Title: "Rebuild document " + strconv.Itoa(i), Body: body.String(),
			Links: links, Tags: []string{"rebuild", "t" + strconv.Itoa(i%32)}, Meta: json.RawMessage(`{"source":"converge bench"}`)}.Normalize()
		if err != nil {
			b.Fatal(err)
		}
		ev := contract.NewUpsertedEvent(d, chunking.Split(d.Body, chunking.DefaultConfig()))
		data, err := ev.Encode()
		if err != nil {
			b.Fatal(err)
		}
		chunks += len(ev.Chunks)
		size += len(data)
		m := nats.NewMsg(contract.Subject(key))
		m.Data = data
		for {
			_, err := js.PublishMsgAsync(m, jetstream.WithMsgID(ev.ID.String()))
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				<-js.PublishAsyncComplete()
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	case <-time.After(2 * time.Minute):
		b.Fatal("the stream's acknowledgements did not arrive within 2 minutes")
	}
	return chunks, size
}
