package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/source"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// demo runs the pipeline on embedded defaults, loads a sample corpus,
// redelivers every event, kills and restarts a projector, verifies, shows a
// search and a graph query, and ends with a convergence report. It acts as
// the stack's clients do: its writes with the writer-client's token, its
// searches, graph queries, rebuild and verify with the operator's token,
// its replay and its reads of the stream as the operator's NATS user, its
// reads of Postgres as converge_reader.
func demo(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge demo")
	flags := devFlags(f, stack.Config{})
	n := f.Int("docs", "", 300, "documents in the sample corpus")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *n < 10 || *n > 100000 {
		return errors.New("-docs must be from 10 to 100000")
	}
	cfg, err := flags()
	if err != nil {
		return err
	}
	cfg.GraphAddrPicked = cfg.GraphAddr == ""
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr} {
		if *a == "" {
			addr, err := stack.FreeAddr()
			if err != nil {
				return err
			}
			*a = addr
		}
	}
	cfg.GraphChild = true
	d := &demoRun{out: out, began: time.Now()}

	d.step("starting the pipeline: a throwaway PostgreSQL 15, an embedded NATS JetStream server, the writer, the relay, the index projector, and the graph projector as a child process")
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		return err
	}
	indexIn, graphIn := "the embedded index", "the embedded graph"
	if s.Index.QdrantURL != "" {
		indexIn = "Qdrant at " + s.Index.QdrantURL
	}
	if s.Graph.Neo4jURL != "" {
		graphIn = "Neo4j at " + neo4j.RedactURL(s.Graph.Neo4jURL)
	}
	d.note("the index projector writes into %s, the graph projector into %s", indexIn, graphIn)
	defer func() { _ = s.Stop() }()
	d.stack = s
	d.pool, err = pgxpool.New(ctx, s.ReaderURL)
	if err != nil {
		return err
	}
	defer d.pool.Close()
	natsOpts, err := s.OperatorNATS.Options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(s.NATSURL, append(natsOpts, nats.Name("converge-demo"))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if d.js, err = jetstream.New(nc); err != nil {
		return err
	}
	d.note("ready in %v; writer API at %s", time.Since(d.began).Round(time.Millisecond), s.APIURL)

	corpus := sampleCorpus(*n, 1)
	d.step(fmt.Sprintf("writing %d documents (with links and tags) through the writer's batch API", len(corpus)))
	if err := d.post(ctx, corpus); err != nil {
		return err
	}
	if err := d.converge(ctx, "initial load"); err != nil {
		return err
	}

	d.step("redelivering every event to both projectors: converge replay index --from-seq 1; converge replay graph --from-seq 1")
	before := d.skipped(ctx)
	for _, name := range []string{"index", "graph"} {
		pending, err := projector.Replay(ctx, d.js, contract.DocsStream, name, projector.ReplayFrom{Seq: 1})
		if err != nil {
			return err
		}
		d.note("%s: %d events to redeliver", name, pending)
	}
	if err := d.caughtUp(ctx); err != nil {
		return err
	}
	d.redelivered = d.skipped(ctx) - before
	d.note("%d events redelivered and recognised as already applied (version markers); nothing written twice", int(d.redelivered))
	if err := d.converge(ctx, "after redelivery"); err != nil {
		return err
	}

	updates := sampleCorpus(*n, 2)[:min(100, *n/2)]
	nWithdraw := min(20, *n/4)
	d.step(fmt.Sprintf("updating %d documents and withdrawing %d while the graph projector is SIGKILLed mid-stream and restarted", len(updates), nWithdraw))
	var withdrawals []map[string]any
	for i := range nWithdraw {
		withdrawals = append(withdrawals, map[string]any{"key": corpus[len(corpus)-1-i]["key"], "version": 3, "withdrawn": true})
	}
	posted := make(chan error, 1)
	go func() { posted <- d.post(ctx, append(updates, withdrawals...)) }()
	time.Sleep(time.Duration(50+rand.IntN(150)) * time.Millisecond) //nolint:gosec // a kill time, not a secret
	if err := s.KillGraphChild(); err != nil {
		return err
	}
	d.kills++
	d.note("graph projector killed (SIGKILL)")
	if err := <-posted; err != nil {
		return err
	}
	if err := s.StartGraphChild(ctx); err != nil {
		return err
	}
	d.note("graph projector restarted")
	if err := d.converge(ctx, "after the kill"); err != nil {
		return err
	}

	d.step(`a search through the index: converge search "lava flows from volcanoes"`)
	if err := searchWith(ctx, []string{"-index-addr", cfg.IndexAddr, "-k", "3", "lava flows from volcanoes"}, out, d.operatorToken); err != nil {
		return err
	}
	key := corpus[0]["key"].(string)
	d.step("a graph query: converge graph " + key)
	if err := graphDocWith(ctx, []string{"-graph-addr", s.GraphAddr, key}, out, d.operatorToken); err != nil {
		return err
	}

	if err := d.mappedTable(ctx, cfg.IndexAddr); err != nil {
		return err
	}

	d.step("rebuilding the index from the stream's start while it serves searches: converge rebuild index")
	began := time.Now()
	st, err := runRebuild(ctx, &rebuild.Client{Addr: cfg.IndexAddr, HTTP: &http.Client{Timeout: 30 * time.Second}, Token: s.OperatorToken}, -1, 50*time.Millisecond, io.Discard)
	if err != nil {
		return err
	}
	d.rebuilt = fmt.Sprintf("index: blue/green into %s in %v, %s dropped", filepath.Base(st.Target), time.Since(began).Round(time.Millisecond), filepath.Base(st.Previous))
	d.note("%s", d.rebuilt)

	d.step("converge verify: every document of Postgres against the index and the graph")
	rep, err := runVerify(ctx, &postgres.Postgres{Pool: d.pool}, bothSides(s.IndexAddr, s.GraphAddr, s.OperatorToken), verify.DefaultBuckets, false)
	if err != nil {
		return err
	}
	printVerify(out, rep)
	d.report(ctx, rep)
	if !rep.Agrees {
		return errDisagree
	}
	return nil
}

type demoRun struct {
	outMu       sync.Mutex // the load goroutine reports while the demo goes on
	out         io.Writer
	began       time.Time
	stack       *stack.Stack
	pool        *pgxpool.Pool
	js          jetstream.JetStream
	steps       int
	written     int
	redelivered float64
	kills       int
	phases      []string
	rebuilt     string
}

// demoProducts is a team's own table, and demoProductsMapping its
// mapping to documents, as a configuration file's sources section gives
// it.
const demoProducts = `CREATE SCHEMA shop;
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, description text NOT NULL, category text NOT NULL);
INSERT INTO shop.products SELECT i, 'Product ' || i, 'A sturdy ' || (ARRAY['kettle', 'lamp', 'chair', 'rope'])[1 + i % 4] || ', model ' || i || '.',
    (ARRAY['kitchen', 'light', 'furniture', 'outdoor'])[1 + i % 4] FROM generate_series(1, 40) i`

var demoProductsMapping = source.Mapping{Name: "products", Table: "shop.products",
	Key: "'product/' || id", Title: "name", Body: "description", Tags: "ARRAY[category]"}

// mappedTable maps a table the team already has, changes it in one of
// its own transactions, and shows the index and the graph following.
func (d *demoRun) mappedTable(ctx context.Context, indexAddr string) error {
	d.step("a table the team already has, mapped to documents: converge source apply (docs/sources.md)")
	admin, err := pgx.Connect(ctx, d.stack.PostgresURL)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, demoProducts); err != nil {
		return fmt.Errorf("demo: create shop.products: %w", err)
	}
	res, err := source.Apply(ctx, admin, demoProductsMapping, false)
	if err != nil {
		return err
	}
	d.note("source products: %s mapped by view %s; %d rows handed over to the writer", res.Table, res.View, res.HandedOver)
	if err := d.inboxDrained(ctx); err != nil {
		return err
	}
	if err := d.converge(ctx, "mapped table"); err != nil {
		return err
	}
	d.note("the team's own transaction: one product rewritten, one deleted, one added")
	if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE shop.products SET description = 'A kettle that whistles like a volcano about to erupt.' WHERE id = 7;
			DELETE FROM shop.products WHERE id = 8;
			INSERT INTO shop.products VALUES (41, 'Product 41', 'A lantern for long nights.', 'light')`)
		return err
	}); err != nil {
		return err
	}
	if err := d.inboxDrained(ctx); err != nil {
		return err
	}
	if err := d.converge(ctx, "mapped table changed"); err != nil {
		return err
	}
	d.note(`converge search "kettle that whistles like a volcano"`)
	if err := searchWith(ctx, []string{"-index-addr", indexAddr, "-k", "1", "kettle that whistles like a volcano"}, d.out, d.operatorToken); err != nil {
		return err
	}
	d.note("converge graph product/7")
	if err := graphDocWith(ctx, []string{"-graph-addr", d.stack.GraphAddr, "product/7"}, d.out, d.operatorToken); err != nil {
		return err
	}
	var withdrawn bool
	if err := d.pool.QueryRow(ctx, `SELECT deleted FROM documents WHERE key = 'product/8'`).Scan(&withdrawn); err != nil {
		return err
	}
	d.note("product/8, its row deleted: withdrawn %v", withdrawn)
	return nil
}

// inboxDrained waits until the writer has taken every row handed over:
// until then the stores agree with a Postgres that does not hold the
// change yet.
func (d *demoRun) inboxDrained(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var pending, refused int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE refused_at IS NULL), count(*) FILTER (WHERE refused_at IS NOT NULL) FROM converge_inbox`).Scan(&pending, &refused); err != nil {
			return err
		}
		switch {
		case refused > 0:
			return fmt.Errorf("demo: the writer refused %d handed-over rows (SELECT * FROM converge_inbox WHERE refused_at IS NOT NULL)", refused)
		case pending == 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("demo: %d handed-over rows still pending after a minute", pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// operatorToken is the stack's operator token, as a tokenSource.
func (d *demoRun) operatorToken() (string, error) { return d.stack.OperatorToken, nil }

func (d *demoRun) step(what string) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.steps++
	fmt.Fprintf(d.out, "\n== %d. %s\n", d.steps, what)
}

func (d *demoRun) note(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.out, "   "+format+"\n", args...)
}

// post writes documents through the writer's batch API, 100 a request,
// with the writer-client's token (the write scope).
func (d *demoRun) post(ctx context.Context, docs []map[string]any) error {
	for lo := 0; lo < len(docs); lo += 100 {
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		for _, doc := range docs[lo:min(lo+100, len(docs))] {
			if err := enc.Encode(doc); err != nil {
				return err
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.stack.APIURL+"/v1/documents:batch", &body)
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		auth.SetBearer(req.Header, d.stack.WriterToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("writer: %w", err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r struct {
				Result string `json:"result"`
				Error  *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				_ = resp.Body.Close()
				return fmt.Errorf("writer: unreadable result line %q", sc.Text())
			}
			if r.Error != nil {
				_ = resp.Body.Close()
				return fmt.Errorf("writer refused a document: %s: %s", r.Error.Code, r.Error.Message)
			}
			d.written++
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("writer: %s", resp.Status)
		}
	}
	d.note("%d writes accepted so far", d.written)
	return nil
}

// converge waits until verify finds both projections equal to Postgres.
func (d *demoRun) converge(ctx context.Context, phase string) error {
	start := time.Now()
	truth := &postgres.Postgres{Pool: d.pool}
	stores := bothSides(d.stack.IndexAddr, d.stack.GraphAddr, d.stack.OperatorToken)
	var last verifyReport
	for time.Since(start) < 2*time.Minute {
		rep, err := runVerify(ctx, truth, stores, verify.DefaultBuckets, false)
		if err == nil && rep.Agrees {
			took := time.Since(start).Round(time.Millisecond)
			d.note("converged: the index and the graph equal Postgres on all %d documents (%v after the last write)", rep.Stores[0].Documents, took)
			d.phases = append(d.phases, fmt.Sprintf("%s: converged in %v", phase, took))
			return nil
		}
		last = rep
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	printVerify(d.out, last)
	return fmt.Errorf("%s: the projections did not converge within 2 minutes", phase)
}

// caughtUp waits until both projectors' consumers exist again and have
// nothing pending.
func (d *demoRun) caughtUp(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for _, name := range []string{"index", "graph"} {
		for {
			c, err := d.js.Consumer(ctx, contract.DocsStream, name)
			if err == nil {
				if info, err := c.Info(ctx); err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Consumer > 0 {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the %s projector did not catch up within 2 minutes", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// skipped sums the projectors' converge_projector_events_total{result="skipped"}.
func (d *demoRun) skipped(ctx context.Context) float64 {
	var total float64
	for _, addr := range []string{d.stack.IndexAddr, d.stack.GraphAddr} {
		base, err := auth.BaseURL(addr)
		if err != nil {
			continue
		}
		m, err := telemetry.Scrape(ctx, base.JoinPath("/metrics").String())
		if err != nil {
			continue
		}
		total += m.Sum("converge_projector_events_total", telemetry.Labels{"result": "skipped"})
	}
	return total
}

func (d *demoRun) report(ctx context.Context, rep verifyReport) {
	var docs, withdrawn, chunks, links int
	_ = d.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE deleted), coalesce(sum(chunk_count), 0), coalesce(sum(cardinality(links)), 0) FROM documents`).
		Scan(&docs, &withdrawn, &chunks, &links)
	var events uint64
	if s, err := d.js.Stream(ctx, contract.DocsStream); err == nil {
		if info, err := s.Info(ctx); err == nil {
			events = info.State.Msgs
		}
	}
	fmt.Fprintf(d.out, "\n== convergence report\n")
	tw := tabwriter.NewWriter(d.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "documents in Postgres\t%d (%d withdrawn), %d chunks, %d links\n", docs, withdrawn, chunks, links)
	fmt.Fprintf(tw, "writes accepted by the writer\t%d\n", d.written)
	fmt.Fprintf(tw, "events in the stream\t%d\n", events)
	fmt.Fprintf(tw, "events redelivered, skipped as applied\t%d\n", int(d.redelivered))
	fmt.Fprintf(tw, "projector kills (SIGKILL)\t%d\n", d.kills)
	for _, p := range d.phases {
		fmt.Fprintf(tw, "convergence\t%s\n", p)
	}
	if d.rebuilt != "" {
		fmt.Fprintf(tw, "rebuild\t%s\n", d.rebuilt)
	}
	for _, r := range rep.Stores {
		verdict := "AGREES with Postgres"
		if !r.Agrees {
			verdict = fmt.Sprintf("DISAGREES on %d documents", len(r.Differences))
		}
		fmt.Fprintf(tw, "verify %s\t%s: %d documents, %d digest buckets compared\n", r.Store, verdict, r.StoreDocuments, r.Buckets)
	}
	fmt.Fprintf(tw, "total time\t%v\n", time.Since(d.began).Round(time.Millisecond))
	_ = tw.Flush()
}

// sampleCorpus generates n documents deterministically: articles on a dozen
// topics, each linking to others of its topic and beyond, tagged by topic
// and kind. revision 2 rewrites the bodies (the same keys, version 2).
func sampleCorpus(n int, revision int64) []map[string]any {
	topics := []struct{ name, kind, words string }{
		{"volcanoes", "earth", "lava magma eruption crater ash basalt caldera vent plume pressure"},
		{"rivers", "earth", "delta current estuary flood bank sediment meander source basin tide"},
		{"glaciers", "earth", "ice moraine crevasse snow valley melt firn calving flow cirque"},
		{"forests", "life", "canopy fern moss root fungus seedling bark leaf understory clearing"},
		{"coral", "life", "reef polyp algae lagoon bleaching current fish atoll spawn shelf"},
		{"birds", "life", "feather migration nest song wing flock beak egg plumage flight"},
		{"databases", "computing", "table index query transaction replication log snapshot commit row schema"},
		{"compilers", "computing", "parser token syntax tree register optimisation bytecode linker loop"},
		{"networks", "computing", "packet router latency protocol socket bandwidth switch frame route hop"},
		{"telescopes", "space", "lens mirror aperture galaxy nebula orbit star spectrum focus dome"},
		{"comets", "space", "tail nucleus orbit ice dust perihelion coma meteor shower sun"},
		{"harbours", "places", "pier crane ship cargo quay lighthouse tide dock ferry breakwater"},
	}
	rng := rand.New(rand.NewPCG(20261130, uint64(revision))) //nolint:gosec // a reproducible corpus, not a secret
	docs := make([]map[string]any, n)
	for i := range n {
		t := topics[i%len(topics)]
		words := strings.Fields(t.words)
		var body strings.Builder
		for p := range 2 + rng.IntN(4) {
			fmt.Fprintf(&body, "## Part %d\n\n", p+1)
			for range 3 + rng.IntN(5) {
				w := make([]string, 6+rng.IntN(8))
				for j := range w {
					w[j] = words[rng.IntN(len(words))]
				}
				fmt.Fprintf(&body, "%s %s. ", strings.ToUpper(w[0][:1])+w[0][1:], strings.Join(w[1:], " "))
			}
			body.WriteString("\n\n")
		}
		if revision > 1 {
			fmt.Fprintf(&body, "Revised (revision %d).\n", revision)
		}
		var links []string
		for range 1 + rng.IntN(3) {
			links = append(links, corpusKey(topics[rng.IntN(len(topics))].name, rng.IntN(n/len(topics)+1)))
		}
		links = append(links, corpusKey(t.name, (i/len(topics)+1)%(n/len(topics)+1)))
		docs[i] = map[string]any{
			"key": corpusKey(t.name, i/len(topics)), "version": revision,
			"title": fmt.Sprintf("%s, article %d", strings.ToUpper(t.name[:1])+t.name[1:], i/len(topics)),
			"body":  body.String(), "links": links, "tags": []string{t.name, t.kind},
			"meta": map[string]any{"source": "converge demo corpus", "revision": revision},
		}
	}
	return docs
}

func corpusKey(topic string, i int) string { return fmt.Sprintf("wiki/%s/%03d", topic, i) }
