package docstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

// rawApplySQL is the store's own statement: the raw side sends it after the
// same key-lock statement, in one pipeline, as Store.Apply does, so it
// measures the database cost of exactly what the store sends.
var rawApplySQL = docstore.ApplySQL

// writerTarget is the writer's rate over its raw statement's, at least.
const writerTarget = 0.8

// applyShape is one way of writing: documents per statement, concurrent
// connections, and statements per side in one measured phase.
type applyShape struct {
	name          string
	docsPerStmt   int
	workers       int
	stmtsPerPhase int
}

// BenchmarkApply compares Store.Apply with the same statement sent through
// pgx with precomputed parameters, the limit the store cannot beat. The two
// sides alternate in short phases (ABBA order) on the same pool, database
// and tables, so machine noise and table growth hit both alike. One
// iteration is one writer phase plus one raw phase.
func BenchmarkApply(b *testing.B) {
	// A phase is 16 (single) or 8 (batch) statements per worker: long
	// enough for the workers, which all start a phase at once, to fall out
	// of step as in steady state, and short enough (20-40 ms at the rates in
	// FIELD-NOTES.md) to interleave often.
	for _, sh := range []applyShape{
		{name: "single", docsPerStmt: 1, workers: 16, stmtsPerPhase: 256},
		{name: "batch", docsPerStmt: 100, workers: 4, stmtsPerPhase: 32},
	} {
		b.Run(sh.name, func(b *testing.B) { benchApply(b, sh) })
	}
}

func benchApply(b *testing.B, sh applyShape) {
	ctx := context.Background()
	url := pg.MigratedDatabase(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	// One connection per worker, as a server sized for this concurrency.
	cfg.MaxConns = int32(sh.workers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	chunkCfg := chunking.DefaultConfig()
	logSettings(b, pool)
	warmConnections(b, pool, sh.workers)

	gen := newDocGen(uint64(sh.docsPerStmt))
	seedAndAnalyze(b, pool, gen, chunkCfg)
	checkRawMatchesStore(b, store, pool, gen, chunkCfg)

	var (
		wTime, rTime time.Duration
		wDocs, rDocs int
		round        int
		rawChunks    int
	)
	for b.Loop() {
		// Generating documents and raw parameters is neither side's cost.
		b.StopTimer()
		writes := make([][]docstore.Write, sh.stmtsPerPhase)
		rawArgs := make([][]any, sh.stmtsPerPhase)
		for i := range sh.stmtsPerPhase {
			writes[i] = make([]docstore.Write, sh.docsPerStmt)
			for j := range writes[i] {
				writes[i][j] = docstore.Write{Doc: gen.next("w")}
			}
			docs := make([]contract.Document, sh.docsPerStmt)
			for j := range docs {
				docs[j] = gen.next("r")
			}
			if rawArgs[i], err = buildRawArgs(docs, chunkCfg); err != nil {
				b.Fatal(err)
			}
			rawChunks += len(rawArgs[i][12].([]uuid.UUID)) // $13, the chunk ids
		}
		b.StartTimer()

		writer := func() {
			d, err := runPhase(ctx, "writer", sh.workers, sh.stmtsPerPhase, func(i int) error {
				outs, err := store.Apply(ctx, writes[i])
				if err != nil {
					return err
				}
				for _, o := range outs {
					if o.Err != nil {
						return fmt.Errorf("writer: %s: %w", o.Key, o.Err)
					}
					if o.Result != docstore.Applied {
						return fmt.Errorf("writer: %s: result %q, want %q", o.Key, o.Result, docstore.Applied)
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			wTime += d
			wDocs += sh.stmtsPerPhase * sh.docsPerStmt
		}
		raw := func() {
			d, err := runPhase(ctx, "raw", sh.workers, sh.stmtsPerPhase, func(i int) error {
				// The same pipeline the store sends: key locks, then the write.
				batch := &pgx.Batch{}
				batch.Queue(docstore.LockSQL, rawArgs[i][0])
				batch.Queue(rawApplySQL, rawArgs[i]...)
				br := pool.SendBatch(ctx, batch)
				_, err := br.Exec()
				if err != nil {
					_ = br.Close()
					return fmt.Errorf("raw lock: %w", err)
				}
				tag, err := br.Exec()
				if cerr := br.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("raw: %w", err)
				}
				if n := tag.RowsAffected(); n != int64(sh.docsPerStmt) {
					return fmt.Errorf("raw: %d of %d documents applied", n, sh.docsPerStmt)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			rTime += d
			rDocs += sh.stmtsPerPhase * sh.docsPerStmt
		}
		// ABBA: neither side always runs first, after the untimed pause.
		if round%2 == 0 {
			writer()
			raw()
		} else {
			raw()
			writer()
		}
		round++
	}

	wRate := float64(wDocs) / wTime.Seconds()
	rRate := float64(rDocs) / rTime.Seconds()
	b.ReportMetric(wRate, "writer_docs/s")
	b.ReportMetric(rRate, "raw_docs/s")
	b.ReportMetric(wRate/rRate, "ratio")
	b.Logf("%s: writer %.0f docs/s, raw %.0f docs/s, ratio %.2f (target >= %.1f)", sh.name, wRate, rRate, wRate/rRate, writerTarget)
	benchsummary.Log(b, benchsummary.Row{Target: "writer / its raw statement, " + sh.name,
		Figure: fmt.Sprintf("%.0f docs/s", wRate), Limit: fmt.Sprintf("%.0f docs/s", rRate), Ratio: wRate / rRate,
		Goal: fmt.Sprintf(">= %.1f", writerTarget), Met: wRate/rRate >= writerTarget})
	b.Logf("%s: %d phases per side, %d docs per statement, %d connections, bodies %d bytes and %.2f chunks on average",
		sh.name, round, sh.docsPerStmt, sh.workers, gen.bodyBytes/gen.n, float64(rawChunks)/float64(rDocs))
}

// runPhase runs stmts calls of do on workers goroutines and returns the wall
// time from the first call to the last return. The workers carry the pprof
// label side, so that -cpuprofile can be split with -tagfocus side=writer.
func runPhase(ctx context.Context, side string, workers, stmts int, do func(i int) error) (time.Duration, error) {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	pprof.Do(ctx, pprof.Labels("side", side), func(context.Context) {
		for range workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= stmts {
						return
					}
					if err := do(i); err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
				}
			})
		}
	})
	wg.Wait()
	return time.Since(start), firstErr
}

// logSettings records the server settings that matter for write throughput.
func logSettings(b *testing.B, pool *pgxpool.Pool) {
	var s string
	err := pool.QueryRow(context.Background(), `SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ' ' ORDER BY name)
		FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'max_wal_size', 'shared_buffers', 'wal_level')`).Scan(&s)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("postgres: %s", s)
}

// warmConnections opens every connection of the pool and prepares the
// statement on each, so neither side pays for it inside a phase.
func warmConnections(b *testing.B, pool *pgxpool.Pool, n int) {
	ctx := context.Background()
	empty, err := buildRawArgs(nil, chunking.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, rawApplySQL, empty...); err != nil {
			b.Fatal(err)
		}
	}
}

// seedAndAnalyze gives the tables rows and planner statistics, as in a live
// database. Without statistics, which autovacuum gathers only a naptime
// (1 min) after the database appears, the planner runs the statement's
// DELETE FROM chunks as a hash join over a sequential scan of all chunks, so
// every statement reads the whole table and both sides measure that alone.
func seedAndAnalyze(b *testing.B, pool *pgxpool.Pool, gen *docGen, cfg chunking.Config) {
	ctx := context.Background()
	for range 20 {
		docs := make([]contract.Document, 100)
		for j := range docs {
			docs[j] = gen.next("seed")
		}
		args, err := buildRawArgs(docs, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, rawApplySQL, args...); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE documents, chunks, outbox`); err != nil {
		b.Fatal(err)
	}
}

// checkRawMatchesStore writes the same documents once through the raw path
// and once through the store and compares the stored rows, so the raw side
// is known to do the store's database work and not less.
func checkRawMatchesStore(b *testing.B, store *docstore.Store, pool *pgxpool.Pool, gen *docGen, cfg chunking.Config) {
	ctx := context.Background()
	docs := make([]contract.Document, 5)
	keys := make([]string, len(docs))
	writes := make([]docstore.Write, len(docs))
	for i := range docs {
		docs[i] = gen.next("check")
		keys[i] = docs[i].Key
		writes[i] = docstore.Write{Doc: docs[i]}
	}
	const snapshotSQL = `SELECT
	    (SELECT json_agg(d ORDER BY d.key) FROM (SELECT key, version, deleted, title, links, tags, meta, content_hash, chunk_count
	        FROM documents WHERE key = ANY($1)) d)::text || ' ' ||
	    (SELECT json_agg(c ORDER BY c.id) FROM chunks c WHERE key = ANY($1))::text || ' ' ||
	    (SELECT json_agg(o ORDER BY o.event_id) FROM (SELECT event_id, key, version, kind, payload
	        FROM outbox WHERE key = ANY($1)) o)::text`
	snapshot := func() string {
		var s string
		if err := pool.QueryRow(ctx, snapshotSQL, keys).Scan(&s); err != nil {
			b.Fatal(err)
		}
		return s
	}

	args, err := buildRawArgs(docs, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, rawApplySQL, args...); err != nil {
		b.Fatal(err)
	}
	raw := snapshot()
	if _, err := pool.Exec(ctx, `DELETE FROM chunks WHERE key = ANY($1)`, keys); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM documents WHERE key = ANY($1)`, keys); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE key = ANY($1)`, keys); err != nil {
		b.Fatal(err)
	}
	if _, err := store.Apply(ctx, writes); err != nil {
		b.Fatal(err)
	}
	if viaStore := snapshot(); viaStore != raw {
		b.Fatalf("raw path stores other rows than the store:\nraw:   %s\nstore: %s", raw, viaStore)
	}
}

// buildRawArgs derives the statement's parameters from docs the way the
// store does (normalise, chunk, build and encode the event, sort by key).
func buildRawArgs(docs []contract.Document, cfg chunking.Config) ([]any, error) {
	type row struct {
		doc           contract.Document
		ev            contract.Event
		payload       string
		links, tags   string
		metaCanonical string
	}
	rows := make([]row, 0, len(docs))
	for _, d := range docs {
		n, err := d.Normalize()
		if err != nil {
			return nil, err
		}
		ev := contract.NewUpsertedEvent(n, chunking.Split(n.Body, cfg))
		payload, err := ev.Encode()
		if err != nil {
			return nil, err
		}
		links, _ := json.Marshal(n.Links)
		tags, _ := json.Marshal(n.Tags)
		rows = append(rows, row{doc: n, ev: ev, payload: string(payload), links: string(links), tags: string(tags), metaCanonical: string(n.Meta)})
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.doc.Key, b.doc.Key) })

	n := len(rows)
	var (
		keys, titles, hashes, kinds, payloads = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		links, tags, metas                    = make([]string, n), make([]string, n), make([]string, n)
		versions                              = make([]int64, n)
		deleted                               = make([]bool, n)
		counts                                = make([]int32, n)
		eventIDs                              = make([]uuid.UUID, n)
		cIDs                                  = []uuid.UUID{}
		cKeys, cTexts, cHashes                = []string{}, []string{}, []string{}
		cVersions                             = []int64{}
		cOrdinals                             = []int32{}
	)
	for i, r := range rows {
		keys[i], versions[i], titles[i] = r.doc.Key, r.doc.Version, r.doc.Title
		links[i], tags[i], metas[i], hashes[i] = r.links, r.tags, r.metaCanonical, r.ev.ContentHash
		counts[i], eventIDs[i], kinds[i], payloads[i] = int32(len(r.ev.Chunks)), r.ev.ID, string(r.ev.Kind), r.payload
		for _, c := range r.ev.Chunks {
			cIDs = append(cIDs, c.ID)
			cKeys = append(cKeys, r.doc.Key)
			cVersions = append(cVersions, r.doc.Version)
			cOrdinals = append(cOrdinals, int32(c.Ordinal))
			cTexts = append(cTexts, c.Text)
			cHashes = append(cHashes, c.Hash)
		}
	}
	return []any{keys, versions, deleted, titles, links, tags, metas, hashes, counts,
		eventIDs, kinds, payloads, cIDs, cKeys, cVersions, cOrdinals, cTexts, cHashes, make([]string, len(keys))}, nil
}

// docGen makes distinct, plausible documents: a heading, a few paragraphs
// of about 1 KB in all (one or two chunks at the default chunking), links,
// tags with a duplicate, and meta with unsorted keys, so that Normalize and
// the chunker do their usual work.
type docGen struct {
	rng       *rand.Rand
	n         int
	bodyBytes int
}

func newDocGen(seed uint64) *docGen {
	return &docGen{rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

var benchWords = strings.Fields(`the writer stores each document version with its chunks and an event
	in one transaction so that projections never miss a change and replays are idempotent because every
	identifier derives from the key the version and the position of a chunk within the body of a page
	about search indexes graphs vectors relays outbox rows consumers retries conflicts tombstones`)

var benchTags = []string{"guide", "reference", "howto", "ops", "api", "design", "faq", "release"}

func (g *docGen) next(side string) contract.Document {
	g.n++
	r := g.rng
	// A random prefix spreads both sides' keys over the same index pages,
	// as independent producers would, instead of appending at one end.
	key := fmt.Sprintf("kb/%08x/%s-%d.md", r.Uint32(), side, g.n)
	words := func(n int) string {
		var sb strings.Builder
		for i := range n {
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(benchWords[r.IntN(len(benchWords))])
		}
		return sb.String()
	}
	sentence := func(n int) string {
		w := words(n)
		return strings.ToUpper(w[:1]) + w[1:]
	}
	title := sentence(4)
	var body strings.Builder
	body.WriteString("# " + title + "\n\n")
	for range 3 + r.IntN(3) {
		body.WriteString(sentence(30+r.IntN(15)) + ".\n\n")
	}
	body.WriteString("- see [" + words(2) + "](kb/related.md)\n")
	g.bodyBytes += body.Len()
	links := make([]string, 2+r.IntN(3))
	for i := range links {
		links[i] = fmt.Sprintf("kb/%08x/page.md", r.Uint32())
	}
	tags := []string{benchTags[r.IntN(len(benchTags))], benchTags[r.IntN(len(benchTags))], "docs", "docs"}
	meta := fmt.Sprintf(`{"source": "wiki", "lang": "en", "author": {"name": "user%d", "team": "docs"}, "revision": %d, "path": ["kb", "%s"]}`,
		r.IntN(100), r.IntN(1000), side)
	return contract.Document{Key: key, Version: 1 + int64(r.IntN(5)), Title: title, Body: body.String(),
		Links: links, Tags: tags, Meta: json.RawMessage(meta)}
}
