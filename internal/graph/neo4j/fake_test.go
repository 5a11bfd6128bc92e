package neo4j

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

// statementNames names every Cypher constant of the package, in the order
// statements.golden lists them.
var statementNames = []struct{ name, cypher string }{
	{"ensureDocumentKey", cypherConstraintDocumentKey},
	{"ensureChunkID", cypherConstraintChunkID},
	{"ensureTagName", cypherConstraintTagName},
	{"showIndexes", cypherShowIndexes},
	{"awaitIndex", cypherAwaitIndex},
	{"dropIndex", cypherDropIndex},
	{"dropConstraint", cypherDropConstraint},
	{"readBatch", cypherReadBatch},
	{"writeDocuments", cypherWriteDocuments},
	{"document", cypherDocument},
	{"scanDocuments", cypherScanDocuments},
	{"wipeRelationships", cypherWipeRelationships},
	{"wipe", cypherWipe},
	{"wipeDocumentRelationships", cypherWipeDocumentRelationships},
	{"wipeDocuments", cypherWipeDocuments},
	{"documentKeys", cypherDocumentKeys},
	{"strayChunks", cypherStrayChunks},
	{"wipeChunks", cypherWipeChunks},
}

func statementName(cypher string) string {
	for _, s := range statementNames {
		if s.cypher == cypher {
			return s.name
		}
	}
	return ""
}

// modelGraph is, in Go, what each statement is meant to do to the graph.
// The fake transactions below interpret a statement by which constant it
// is and by its parameters, never by parsing Cypher. It stands in for a
// server so that the Go side (plans, batches, retries, answers, decoding)
// can be tested; whether the Cypher does what the model does needs a real
// Neo4j (TestConformance, on the test server).
type modelGraph struct {
	docs   map[string]*modelDoc
	chunks map[string]modelChunk // by id
	tags   map[string]bool

	// The schema: indexes by name.
	indexes map[string]modelIndex
	// awaitOnline makes db.awaitIndex find the population of a
	// populating index done; without it the call times out.
	awaitOnline bool
}

// modelIndex is an index: its owning constraint ("" for none), its state
// and how much of it is populated.
type modelIndex struct {
	owner   string
	state   string
	percent float64
}

// constraintName is the constraint a create statement makes.
func constraintName(cypher string) string {
	for _, c := range constraints {
		if c.create.cypher == cypher {
			return c.name
		}
	}
	panic("model: not a constraint's statement")
}

func schemaError(code, msg string) error { return &neo4j.Neo4jError{Code: code, Msg: msg} }

type modelDoc struct {
	hasVersion bool // false: a stub
	version    int64
	deleted    bool
	title      string
	hash       string
	chunks     map[string]bool // HAS_CHUNK, by chunk id
	links      map[string]bool // LINKS_TO, by target key
	tagged     map[string]bool // TAGGED, by tag name
}

type modelChunk struct {
	key     string
	version int64
	ordinal int64
	hash    string
}

func newModelGraph() *modelGraph {
	return &modelGraph{docs: map[string]*modelDoc{}, chunks: map[string]modelChunk{}, tags: map[string]bool{},
		indexes: map[string]modelIndex{}}
}

// held reports whether a document node holds the chunk id (HAS_CHUNK).
func (g *modelGraph) held(id string) bool {
	for _, d := range g.docs {
		if d.chunks[id] {
			return true
		}
	}
	return false
}

func newModelDoc() *modelDoc {
	return &modelDoc{chunks: map[string]bool{}, links: map[string]bool{}, tagged: map[string]bool{}}
}

func (g *modelGraph) clone() *modelGraph {
	c := &modelGraph{docs: make(map[string]*modelDoc, len(g.docs)), chunks: maps.Clone(g.chunks), tags: maps.Clone(g.tags),
		indexes: maps.Clone(g.indexes), awaitOnline: g.awaitOnline}
	for k, d := range g.docs {
		dc := *d
		dc.chunks, dc.links, dc.tagged = maps.Clone(d.chunks), maps.Clone(d.links), maps.Clone(d.tagged)
		c.docs[k] = &dc
	}
	return c
}

func rowsParam(params map[string]any, name string) []map[string]any {
	rows, ok := params[name].([]map[string]any)
	if !ok {
		panic(fmt.Sprintf("model: parameter %s is %T", name, params[name]))
	}
	return rows
}

func stringsParam(params map[string]any, name string) []string {
	s, ok := params[name].([]string)
	if !ok {
		panic(fmt.Sprintf("model: parameter %s is %T", name, params[name]))
	}
	return s
}

// run applies one statement.
func (g *modelGraph) run(cypher string, params map[string]any) ([]record, error) {
	switch cypher {
	case cypherConstraintDocumentKey, cypherConstraintChunkID, cypherConstraintTagName:
		name := constraintName(cypher)
		switch ix, ok := g.indexes[name]; {
		case ok && ix.owner == name:
			return nil, nil // IF NOT EXISTS
		case ok:
			return nil, schemaError("Neo.ClientError.Schema.IndexWithNameAlreadyExists",
				fmt.Sprintf("There already exists an index called '%s'.", name))
		}
		g.indexes[name] = modelIndex{owner: name, state: indexOnline, percent: 100}
		return nil, nil
	case cypherShowIndexes:
		var out []record
		for _, name := range stringsParam(params, "names") {
			if ix, ok := g.indexes[name]; ok {
				var owner any
				if ix.owner != "" {
					owner = ix.owner
				}
				out = append(out, record{"name": name, "owningConstraint": owner, "state": ix.state, "populationPercent": ix.percent})
			}
		}
		return out, nil
	case cypherAwaitIndex:
		name := params["name"].(string)
		ix, ok := g.indexes[name]
		switch {
		case !ok:
			return nil, schemaError("Neo.ClientError.Schema.IndexNotFound", fmt.Sprintf("No such index '%s'", name))
		case ix.state == indexFailed:
			return nil, schemaError("Neo.ClientError.Procedure.ProcedureCallFailed", "Index is in FAILED state")
		case ix.state == indexPopulating && !g.awaitOnline:
			return nil, schemaError("Neo.ClientError.Procedure.ProcedureTimedOut", fmt.Sprintf("Index on '%s' did not come online", name))
		}
		ix.state, ix.percent = indexOnline, 100
		g.indexes[name] = ix
		return nil, nil
	case cypherDropIndex:
		name := params["name"].(string)
		if ix, ok := g.indexes[name]; ok && ix.owner != "" {
			return nil, schemaError("Neo.DatabaseError.Schema.IndexDropFailed",
				fmt.Sprintf("Unable to drop index: Index belongs to constraint: `%s`", ix.owner))
		}
		delete(g.indexes, name)
		return nil, nil
	case cypherDropConstraint:
		name := params["name"].(string)
		if ix, ok := g.indexes[name]; ok && ix.owner == name {
			delete(g.indexes, name)
		}
		return nil, nil
	case cypherReadBatch:
		var out []record
		for _, key := range stringsParam(params, "keys") {
			d := g.docs[key]
			if d == nil {
				continue
			}
			rec := record{"key": key, "version": nil}
			if d.hasVersion {
				rec["version"] = d.version
			}
			links, tags := []any{}, []any{}
			for t := range d.links {
				links = append(links, t)
			}
			for t := range d.tagged {
				tags = append(tags, t)
			}
			rec["links"], rec["tags"] = links, tags
			out = append(out, rec)
		}
		return out, nil
	case cypherWriteDocuments:
		// The locks create the document nodes not yet seen as stubs,
		// and the tags.
		for _, key := range stringsParam(params, "keys") {
			if g.docs[key] == nil {
				g.docs[key] = newModelDoc()
			}
		}
		for _, name := range stringsParam(params, "names") {
			g.tags[name] = true
		}
		rows := rowsParam(params, "rows")
		applied := make([]bool, len(rows))
		for i, row := range rows {
			applied[i] = g.writeDocument(row)
		}
		// The fence counts once every row is written.
		out := make([]record, len(rows))
		for i, row := range rows {
			key := row["key"].(string)
			d := g.docs[key]
			out[i] = record{"key": key, "applied": applied[i], "chunks": int64(len(d.chunks)),
				"links": int64(len(d.links)), "tags": int64(len(d.tagged))}
		}
		return out, nil
	case cypherDocument:
		key := params["key"].(string)
		if g.docs[key] == nil {
			return nil, nil
		}
		return []record{g.view(key)}, nil
	case cypherScanDocuments:
		after, limit := params["after"].(string), params["limit"].(int64)
		keys := slices.Sorted(maps.Keys(g.docs))
		var out []record
		for _, key := range keys {
			if key > after && int64(len(out)) < limit {
				out = append(out, g.view(key))
			}
		}
		// The server returns the page in no guaranteed order.
		slices.Reverse(out)
		return out, nil
	case cypherWipeRelationships:
		// HAS_CHUNK, then LINKS_TO, then TAGGED, by key, up to the limit.
		limit := params["limit"].(int64)
		var n int64
		for _, edges := range []func(*modelDoc) map[string]bool{
			func(d *modelDoc) map[string]bool { return d.chunks },
			func(d *modelDoc) map[string]bool { return d.links },
			func(d *modelDoc) map[string]bool { return d.tagged },
		} {
			for _, key := range slices.Sorted(maps.Keys(g.docs)) {
				m := edges(g.docs[key])
				for _, to := range slices.Sorted(maps.Keys(m)) {
					if n >= limit {
						return []record{{"deleted": n}}, nil
					}
					delete(m, to)
					n++
				}
			}
		}
		return []record{{"deleted": n}}, nil
	case cypherWipe:
		// Documents first, then chunks, then tags, up to the limit.
		limit := params["limit"].(int64)
		var n int64
		// DETACH: the relationships of a deleted node go with it.
		wipe(g.docs, &n, limit, func(key string) {
			for _, d := range g.docs {
				delete(d.links, key)
			}
		})
		wipe(g.chunks, &n, limit, func(id string) {
			for _, d := range g.docs {
				delete(d.chunks, id)
			}
		})
		wipe(g.tags, &n, limit, func(name string) {
			for _, d := range g.docs {
				delete(d.tagged, name)
			}
		})
		return []record{{"deleted": n}}, nil
	case cypherDocumentKeys:
		after, limit := params["after"].(string), params["limit"].(int64)
		var out []record
		for _, key := range slices.Sorted(maps.Keys(g.docs)) {
			if key > after && int64(len(out)) < limit {
				out = append(out, record{"key": key})
			}
		}
		return out, nil
	case cypherStrayChunks:
		var out []record
		for id, c := range g.chunks {
			if !g.held(id) {
				out = append(out, record{"key": c.key, "id": id})
			}
		}
		return out, nil
	case cypherWipeChunks:
		var n int64
		ids := stringsParam(params, "ids")
		for id := range g.chunks {
			if slices.Contains(ids, id) && !g.held(id) {
				delete(g.chunks, id)
				for _, d := range g.docs {
					delete(d.chunks, id)
				}
				n++
			}
		}
		return []record{{"deleted": n}}, nil
	case cypherWipeDocumentRelationships:
		var n int64
		for _, key := range stringsParam(params, "keys") {
			d := g.docs[key]
			if d == nil {
				continue
			}
			for id := range d.chunks {
				delete(g.chunks, id) // DETACH DELETE of the chunk node
			}
			d.chunks, d.links, d.tagged = map[string]bool{}, map[string]bool{}, map[string]bool{}
			n++
		}
		return []record{{"deleted": n}}, nil
	case cypherWipeDocuments:
		var n int64
		for _, key := range stringsParam(params, "keys") {
			d := g.docs[key]
			if d == nil {
				continue
			}
			linked := false
			for _, other := range g.docs {
				linked = linked || other.links[key]
			}
			if linked {
				stub := newModelDoc()
				stub.chunks, stub.links, stub.tagged = d.chunks, d.links, d.tagged
				g.docs[key] = stub
				continue
			}
			for _, other := range g.docs {
				delete(other.links, key)
			}
			delete(g.docs, key)
			n++
		}
		return []record{{"deleted": n}}, nil
	}
	return nil, fmt.Errorf("model: not a statement of the package: %q", cypher)
}

// writeDocument is one row of writeDocuments: the guard and, if it
// applies, the document's fields, chunks and outgoing relationships
// replaced by the row's, the chunk nodes, link targets (stubs) and tags
// merged.
func (g *modelGraph) writeDocument(row map[string]any) bool {
	key, version := row["key"].(string), row["version"].(int64)
	d := g.docs[key]
	if d == nil {
		d = newModelDoc()
		g.docs[key] = d
	}
	repair, ok := row["repair"].(bool)
	if !ok {
		panic(fmt.Sprintf("model: writeDocuments row without a repair flag: %v", row))
	}
	if d.hasVersion && d.version >= version && (!repair || d.version != version) {
		return false
	}
	d.hasVersion, d.version = true, version
	d.deleted, d.title, d.hash = row["deleted"].(bool), row["title"].(string), row["content_hash"].(string)
	for id := range d.chunks {
		delete(g.chunks, id)
	}
	d.chunks, d.links, d.tagged = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range rowsParam(row, "chunks") {
		id := c["id"].(string)
		g.chunks[id] = modelChunk{key: key, version: version, ordinal: c["ordinal"].(int64), hash: c["content_hash"].(string)}
		d.chunks[id] = true
	}
	for _, target := range stringsParam(row, "links") {
		if g.docs[target] == nil {
			g.docs[target] = newModelDoc()
		}
		d.links[target] = true
	}
	for _, name := range stringsParam(row, "tags") {
		g.tags[name] = true
		d.tagged[name] = true
	}
	return true
}

// view is the record cypherView returns for key, with the driver's types:
// nil for a property the node lacks, []any for lists (in map order, as
// unordered as the server's), int64 for integers.
func (g *modelGraph) view(key string) record {
	d := g.docs[key]
	rec := record{"key": key, "version": nil, "deleted": nil, "title": nil, "content_hash": nil, "stub": nil}
	if d.hasVersion {
		rec["version"], rec["deleted"], rec["title"], rec["content_hash"] = d.version, d.deleted, d.title, d.hash
	} else {
		rec["stub"] = true
	}
	chunks, links, tags, linkedBy := []any{}, []any{}, []any{}, []any{}
	for id := range d.chunks {
		c := g.chunks[id]
		chunks = append(chunks, map[string]any{"id": id, "ordinal": c.ordinal, "content_hash": c.hash})
	}
	for t := range d.links {
		links = append(links, t)
	}
	for t := range d.tagged {
		tags = append(tags, t)
	}
	for k, other := range g.docs {
		if other.links[key] {
			linkedBy = append(linkedBy, k)
		}
	}
	rec["chunks"], rec["links"], rec["tags"], rec["linked_by"] = chunks, links, tags, linkedBy
	return rec
}

// call is one statement a fake transaction ran.
type call struct {
	name   string
	params map[string]any
}

// attempt is one run of a unit of work.
type attempt struct {
	write     bool
	calls     []call
	committed bool
	err       error
}

// fakeRunner runs units of work against a modelGraph the way the driver's
// managed transactions run them against a server: each attempt works on a
// copy of the graph that replaces it only on commit (an error rolls the
// attempt back), and an error the driver deems retryable
// (neo4j.IsRetryable: transient errors such as DeadlockDetected) runs the
// work again, up to maxAttempts times. Transactions are serialised.
type fakeRunner struct {
	mu          sync.Mutex
	graph       *modelGraph
	maxAttempts int
	// fail, when set, may fail a statement before it runs: n counts the
	// transactions (1-based), try the attempts within it.
	fail func(n, try int, name string) error
	// answer, when set, may change a statement's records.
	answer func(name string, recs []record) []record
	// onRun, when set, sees every call before it runs.
	onRun func(c call)
	// between, when set, changes the committed graph before each
	// transaction attempt: what other instances commit meanwhile.
	between  func(g *modelGraph)
	attempts []attempt
	txs      int
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{graph: newModelGraph(), maxAttempts: 5}
}

func (r *fakeRunner) ExecuteWrite(ctx context.Context, work func(tx) error) error {
	return r.execute(ctx, true, work)
}

func (r *fakeRunner) ExecuteRead(ctx context.Context, work func(tx) error) error {
	return r.execute(ctx, false, work)
}

func (r *fakeRunner) execute(ctx context.Context, write bool, work func(tx) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.txs++
	for try := 1; ; try++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.between != nil {
			r.between(r.graph)
		}
		t := &fakeTx{runner: r, graph: r.graph.clone(), n: r.txs, try: try}
		err := work(t)
		a := attempt{write: write, calls: t.calls, err: err}
		if err == nil {
			if write {
				r.graph = t.graph
			}
			a.committed = true
		}
		r.attempts = append(r.attempts, a)
		if err == nil || !neo4j.IsRetryable(err) || try == r.maxAttempts {
			return err
		}
	}
}

// committed is the calls of the committed write transactions.
func (r *fakeRunner) committed() [][]call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]call
	for _, a := range r.attempts {
		if a.write && a.committed {
			out = append(out, a.calls)
		}
	}
	return out
}

type fakeTx struct {
	runner *fakeRunner
	graph  *modelGraph
	n, try int
	calls  []call
}

func (t *fakeTx) Run(ctx context.Context, cypher string, params map[string]any) ([]record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	name := statementName(cypher)
	t.calls = append(t.calls, call{name: name, params: params})
	if t.runner.onRun != nil {
		t.runner.onRun(t.calls[len(t.calls)-1])
	}
	if t.runner.fail != nil {
		if err := t.runner.fail(t.n, t.try, name); err != nil {
			return nil, err
		}
	}
	recs, err := t.graph.run(cypher, params)
	if err == nil && t.runner.answer != nil {
		recs = t.runner.answer(name, recs)
	}
	return recs, err
}

// newTestBackend is a Backend on r.
func newTestBackend(r *fakeRunner, batchSize int) *Backend {
	cfg := Config{URL: "bolt://model", BatchSize: batchSize, WipeBatchSize: 10 * batchSize}
	cfg.setDefaults()
	return &Backend{cfg: cfg, run: r}
}

// wipe deletes m's entries in key order while *n < limit, counting them in
// *n, and detaches each from what links to it.
func wipe[V any](m map[string]V, n *int64, limit int64, detach func(key string)) {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if *n >= limit {
			return
		}
		delete(m, k)
		detach(k)
		*n++
	}
}
