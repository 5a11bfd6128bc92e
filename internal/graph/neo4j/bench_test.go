package neo4j

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/pkg/contract"
)

// BenchmarkPlanBatch measures turning one batch of 100 documents (8
// chunks, 5 links, 3 tags each) into the parameters of its statements.
func BenchmarkPlanBatch(b *testing.B) {
	docs := make([]graph.Doc, 100)
	for i := range docs {
		var links []string
		for j := range 5 {
			links = append(links, fmt.Sprintf("doc-%03d", (i*7+j)%100))
		}
		docs[i] = doc(fmt.Sprintf("doc-%03d", i), 1, 8, links, []string{"t1", "t2", fmt.Sprint("t", i%10)})
	}
	b.ReportAllocs()
	for b.Loop() {
		batches, err := planBatches(docs, 100)
		if err != nil {
			b.Fatal(err)
		}
		_ = writeStatement(batches[0], nil)
	}
}

// cypherPlainMerge writes the same graph as Apply in one plain UNWIND ...
// MERGE statement, without the freshness guard, the replacement of older
// chunks and edges, the lock ordering or the count fence: the yardstick of
// BenchmarkApplyNeo4j.
const cypherPlainMerge = `UNWIND $rows AS row
MERGE (d:Document {key: row.key})
SET d.version = row.version, d.title = row.title, d.content_hash = row.content_hash, d.deleted = false
WITH d, row
CALL { WITH d, row
  UNWIND row.chunks AS ch
  MERGE (c:Chunk {id: ch.id})
  SET c.key = row.key, c.version = row.version, c.ordinal = ch.ordinal, c.content_hash = ch.content_hash
  MERGE (d)-[:HAS_CHUNK]->(c) }
CALL { WITH d, row
  UNWIND row.links AS link
  MERGE (t:Document {key: link})
  MERGE (d)-[:LINKS_TO]->(t) }
CALL { WITH d, row
  UNWIND row.tags AS tag
  MERGE (t:Tag {name: tag})
  MERGE (d)-[:TAGGED]->(t) }`

// plainRows are docs as the parameter of cypherPlainMerge.
func plainRows(docs []graph.Doc) []map[string]any {
	rows := make([]map[string]any, len(docs))
	for i, d := range docs {
		chunks := make([]map[string]any, len(d.Chunks))
		for j, c := range d.Chunks {
			chunks[j] = map[string]any{"id": c.ID.String(), "ordinal": int64(c.Ordinal), "content_hash": c.ContentHash}
		}
		rows[i] = map[string]any{"key": d.Key, "version": d.Version, "title": d.Title, "content_hash": d.ContentHash,
			"chunks": chunks, "links": d.Links, "tags": d.Tags}
	}
	return rows
}

// benchDocs is batch i of new documents under prefix: 100 documents of 4
// chunks, 3 links (within the batch and to the one before) and 2 tags.
func benchDocs(prefix string, i int) []graph.Doc {
	docs := make([]graph.Doc, 100)
	for j := range docs {
		key := func(batch, n int) string { return fmt.Sprintf("%s-%06d-%03d", prefix, batch, n) }
		links := []string{key(i, (j+1)%100), key(i, (j+37)%100), key(max(i-1, 0), j)}
		docs[j] = doc(key(i, j), 1, 4, links, []string{"common", fmt.Sprint("t", j%10)})
	}
	return docs
}

// BenchmarkApplyNeo4j measures documents/s that Apply writes into the
// test's real Neo4j server (one batch of 100 new documents per
// iteration), and beside it, in the same run and on the same server,
// the same documents written by one plain UNWIND ... MERGE statement per
// batch. plain/apply is how many times faster the plain statement is:
// the cost of the guard, the replacement of older versions' chunks and
// edges, the lock ordering and the count fence. The absolute figures
// are of this machine and its load.
func BenchmarkApplyNeo4j(b *testing.B) {
	be := newServerBackend(b, Config{})
	if err := be.Ensure(ctx()); err != nil {
		b.Fatal(err)
	}
	var applyTime, plainTime time.Duration
	docs := 0
	i := 0
	for b.Loop() {
		apply, plain := benchDocs("apply", i), benchDocs("plain", i)
		// Alternate which goes first, so that neither always meets the
		// other's checkpoint or cache state.
		for k := range 2 {
			start := time.Now()
			if (k == 0) == (i%2 == 0) {
				if _, err := be.Apply(ctx(), apply); err != nil {
					b.Fatal(err)
				}
				applyTime += time.Since(start)
			} else {
				err := be.run.ExecuteWrite(ctx(), func(t tx) error {
					_, err := t.Run(ctx(), cypherPlainMerge, map[string]any{"rows": plainRows(plain)})
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				plainTime += time.Since(start)
			}
		}
		docs += len(apply)
		i++
	}
	b.ReportMetric(float64(docs)/applyTime.Seconds(), "apply-docs/s")
	b.ReportMetric(float64(docs)/plainTime.Seconds(), "plain-docs/s")
	b.ReportMetric(applyTime.Seconds()/plainTime.Seconds(), "plain/apply")
}

// benchEvents are n events of new documents under prefix, shaped as
// benchDocs' documents: 4 chunks, 3 links (two within the set, one to the
// document before), 2 tags.
func benchEvents(b *testing.B, prefix string, n int) []contract.Event {
	b.Helper()
	key := func(i int) string { return fmt.Sprintf("%s-%06d", prefix, i) }
	evs := make([]contract.Event, n)
	for i := range evs {
		chunks := []string{fmt.Sprintf("chunk a of %s ", key(i)), "chunk b ", "chunk c ", "chunk d"}
		d, err := contract.Document{Key: key(i), Version: 1, Title: "bench", Body: strings.Join(chunks, ""),
			Links: []string{key((i + 1) % n), key((i + 37) % n), key(max(i-1, 0))},
			Tags:  []string{"common", fmt.Sprint("t", i%10)}}.Normalize()
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = contract.NewUpsertedEvent(d, chunks)
	}
	return evs
}

// benchRounds is how many rounds of each side BenchmarkProjectorNeo4j
// measures, alternating their order.
const benchRounds = 3

// BenchmarkProjectorNeo4j measures the graph projector end to end on the
// test's real Neo4j server (events in a JetStream stream -> runtime ->
// decode and verify -> Apply, with its guard, replacement, lock order and
// count fence) against the same documents written by one plain UNWIND ...
// MERGE statement per batch of 100 through the driver (cypherPlainMerge),
// in rounds that alternate which goes first, on the same server. b.N
// counts batches of 100 documents: each side writes 100*b.N documents in
// all (at least 100 a round), each round new ones. The absolute figures
// are of this machine and its load.
func BenchmarkProjectorNeo4j(b *testing.B) {
	be := newServerBackend(b, Config{})
	if err := be.Ensure(ctx()); err != nil {
		b.Fatal(err)
	}
	p, err := graph.New(ctx(), be)
	if err != nil {
		b.Fatal(err)
	}
	perRound := max(100, 100*b.N/benchRounds/100*100)
	c := projectortest.Comparison{Name: "graph on Neo4j against a plain UNWIND ... MERGE", Unit: "docs", N: float64(perRound)}
	for round := range benchRounds {
		prefix := fmt.Sprintf("r%d-%d", b.N, round)
		proj := benchEvents(b, "proj-"+prefix, perRound)
		plain := make([]graph.Doc, perRound)
		for i, ev := range benchEvents(b, "plain-"+prefix, perRound) {
			plain[i] = graph.FromEvent(&ev)
		}
		js := projectortest.Prefill(b, proj)
		var r projectortest.Round
		sides := []func(){
			func() {
				r.Projector = projectortest.Project(b, js, "bench", p)
				last := proj[len(proj)-1]
				if v, ok, err := be.Document(ctx(), last.Key); err != nil || !ok || v.Version != 1 || len(v.Chunks) != len(last.Chunks) {
					b.Fatalf("after the run: %+v %v %v", v, ok, err)
				}
			},
			func() {
				start := time.Now()
				for i := 0; i < len(plain); i += 100 {
					err := be.run.ExecuteWrite(ctx(), func(t tx) error {
						_, err := t.Run(ctx(), cypherPlainMerge, map[string]any{"rows": plainRows(plain[i:min(i+100, len(plain))])})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				r.Raw = time.Since(start)
			},
		}
		if round%2 == 1 {
			slices.Reverse(sides)
		}
		for _, side := range sides {
			side()
		}
		c.Add(r)
	}
	c.Report(b, "")
	b.Logf("Neo4j: %d new documents a side a round (4 chunks, 3 links, 2 tags each); the projector's defaults (batches of 256 in 2 shards, %d documents a transaction)",
		perRound, be.cfg.BatchSize)
}
