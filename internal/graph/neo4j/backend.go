package neo4j

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
	"github.com/neo4j/neo4j-go-driver/v5/neo4j/config"

	"github.com/converge-sync/converge/internal/graph"
)

// closeTimeout bounds Close, which has no context.
const closeTimeout = 10 * time.Second

// Backend is a [graph.Backend] on one Neo4j database. It is safe for
// concurrent use.
type Backend struct {
	cfg    Config
	run    runner
	driver neo4j.DriverWithContext // nil when run is not the driver's
}

var _ graph.Backend = (*Backend)(nil)

// New connects to Neo4j, checks that the server answers with these
// credentials and is Neo4j 5.3 or later, and returns the backend. It does
// not touch the database: call [Backend.Ensure] before writing.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth := neo4j.NoAuth()
	if cfg.User != "" {
		auth = neo4j.BasicAuth(cfg.User, cfg.Password, "")
	}
	driver, err := neo4j.NewDriverWithContext(cfg.URL, auth, func(c *config.Config) {
		c.MaxTransactionRetryTime = cfg.MaxRetryTime
		if cfg.TLS != nil {
			c.TlsConfig = cfg.TLS.Clone()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("neo4j: %s: %w", RedactURL(cfg.URL), err)
	}
	if err := checkServer(ctx, driver, cfg); err != nil {
		_ = driver.Close(ctx)
		return nil, err
	}
	return &Backend{cfg: cfg, run: driverRunner{driver: driver, database: cfg.Database, txTimeout: cfg.TxTimeout}, driver: driver}, nil
}

// checkServer verifies connectivity and the server's version: the count
// fence uses COUNT subqueries (Neo4j 5.3), which an older server rejects
// as a syntax error, a failure that would dead-letter every event.
func checkServer(ctx context.Context, driver neo4j.DriverWithContext, cfg Config) error {
	who := RedactURL(cfg.URL)
	if cfg.User != "" {
		who += fmt.Sprintf(" as %q", cfg.User)
	}
	if err := driver.VerifyConnectivity(ctx); err != nil {
		return fmt.Errorf("neo4j: cannot connect to %s: %w", who, err)
	}
	info, err := driver.GetServerInfo(ctx)
	if err != nil {
		return fmt.Errorf("neo4j: cannot connect to %s: %w", who, err)
	}
	if major, minor, ok := agentVersion(info.Agent()); ok && (major < 5 || major == 5 && minor < 3) {
		return fmt.Errorf("neo4j: server at %s is %s; converge needs Neo4j 5.3 or later", who, info.Agent())
	}
	return nil
}

// agentVersion reads the version of a server agent such as
// "Neo4j/5.26.1" (5, 26) or "Neo4j/2025.01.0" (2025, 1: the calendar
// versions that followed 5.26). ok is false for an agent it cannot read,
// which New lets pass.
func agentVersion(agent string) (major, minor int, ok bool) {
	version, found := strings.CutPrefix(agent, "Neo4j/")
	if !found {
		return 0, 0, false
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// RedactURL is raw without the password it may carry, for logs and
// output; an unparseable URL is named, not shown.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the configured URL"
	}
	return u.Redacted()
}

func (b *Backend) fail(op string, err error) error {
	return &Error{Op: op, Database: b.cfg.Database, Err: err}
}

// Apply writes docs in batches of Config.BatchSize, sorted by key, one
// write transaction per batch, or per half of a batch too large for the
// server (see the package documentation for the statements and their
// order). On an error what was committed before the failing transaction
// stays committed and applied is nil.
func (b *Backend) Apply(ctx context.Context, docs []graph.Doc) (applied []bool, err error) {
	batches, err := planBatches(docs, b.cfg.BatchSize)
	if err != nil {
		return nil, b.fail("apply", err)
	}
	applied = make([]bool, len(docs))
	for _, batch := range batches {
		flags, err := b.applySplitting(ctx, batch)
		if err != nil {
			return nil, b.fail("apply", err)
		}
		for i, r := range batch {
			applied[r.index] = flags[i]
		}
	}
	return applied, nil
}

// applySplitting applies batch in one transaction or, when that is too
// large for the server ([ErrTooLarge]), in two halves, each split again
// as needed: a batch as large as the server allows passes, and only a
// single document too large fails.
func (b *Backend) applySplitting(ctx context.Context, batch []docRow) ([]bool, error) {
	flags, err := b.applyBatch(ctx, batch)
	if err == nil || len(batch) == 1 || !errors.Is(err, ErrTooLarge) {
		return flags, err
	}
	half := len(batch) / 2
	first, err := b.applySplitting(ctx, batch[:half])
	if err != nil {
		return nil, err
	}
	second, err := b.applySplitting(ctx, batch[half:])
	if err != nil {
		return nil, err
	}
	return append(first, second...), nil
}

// errStopRetry ends a managed transaction's retries: the driver retries
// every error wrapping a transient *neo4j.Neo4jError, and would retry one
// too large for the server until Config.MaxRetryTime.
var errStopRetry = errors.New("not retried")

// applyBatch runs one batch's transaction and returns its applied flags.
func (b *Backend) applyBatch(ctx context.Context, batch []docRow) ([]bool, error) {
	var (
		flags  []bool
		failed string // the statement that failed last, to name in the error
		large  error  // the error of a transaction too large for the server
	)
	err := b.run.ExecuteWrite(ctx, func(t tx) error {
		flags, failed, large = nil, "", nil
		// Errors of Run go back to the retry logic as they are: it
		// recognises transient ones by their type. A transaction too
		// large would fail the same way again: it is not retried.
		run := func(st statement) ([]record, error) {
			recs, err := t.Run(ctx, st.cypher, st.params)
			if err != nil {
				failed = st.name
				if tooLarge(err) {
					large = err
					return nil, errStopRetry
				}
			}
			return recs, err
		}
		recs, err := run(readStatement(batch))
		if err != nil {
			return err
		}
		held, err := readResult(recs)
		if err != nil {
			return err
		}
		if recs, err = run(writeStatement(batch, held)); err != nil {
			return err
		}
		answer, err := writeResult(batch, recs)
		if err != nil {
			return err
		}
		flags = answer
		return nil
	})
	if large == nil && tooLarge(err) { // at commit, after the driver's retries
		large = err
	}
	if large != nil {
		if failed == "" {
			failed = "commit"
		}
		return nil, fmt.Errorf("%s: %d documents: %w: %w", failed, len(batch), ErrTooLarge, large)
	}
	if err != nil {
		if failed != "" {
			err = fmt.Errorf("%s: %w", failed, err)
		}
		return nil, err
	}
	if len(flags) != len(batch) {
		return nil, errors.New("the write transaction ended without an answer")
	}
	return flags, nil
}

// Document reads what the graph holds about key.
func (b *Backend) Document(ctx context.Context, key string) (v graph.View, ok bool, err error) {
	err = b.run.ExecuteRead(ctx, func(t tx) error {
		v, ok = graph.View{}, false
		recs, err := t.Run(ctx, cypherDocument, map[string]any{"key": key})
		if err != nil {
			return err
		}
		switch len(recs) {
		case 0:
			return nil
		case 1:
			v, err = decodeView(recs[0])
			ok = err == nil
			return err
		default:
			return fmt.Errorf("%d nodes of key %q", len(recs), key)
		}
	})
	if err != nil {
		return graph.View{}, false, b.fail("read document", err)
	}
	return v, ok, nil
}

// ScanDocuments reads the documents in key order, Config.BatchSize per read
// transaction, and calls fn for each outside the transaction; fn's error
// ends the scan and is returned as it is. A scan concurrent with writes
// sees each document once, in the state of the page that read it.
func (b *Backend) ScanDocuments(ctx context.Context, fn func(graph.View) error) error {
	limit := b.cfg.BatchSize
	after := ""
	for {
		var page []graph.View
		err := b.run.ExecuteRead(ctx, func(t tx) error {
			page = page[:0]
			recs, err := t.Run(ctx, cypherScanDocuments, map[string]any{"after": after, "limit": int64(limit)})
			if err != nil {
				return err
			}
			for _, rec := range recs {
				v, err := decodeView(rec)
				if err != nil {
					return err
				}
				page = append(page, v)
			}
			return nil
		})
		if err != nil {
			return b.fail("scan documents", err)
		}
		sortViews(page)
		if len(page) > 0 && page[0].Key <= after {
			return b.fail("scan documents", fmt.Errorf("a page after %q began with %q", after, page[0].Key))
		}
		for _, v := range page {
			if err := fn(v); err != nil {
				return err
			}
		}
		if len(page) < limit {
			return nil
		}
		after = page[len(page)-1].Key
	}
}

// Wipe deletes the whole projection (Document, Chunk and Tag nodes and
// their relationships) for a rebuild in place: Neo4j Community has one
// database, so a graph is rebuilt by wiping it and replaying the stream.
// The constraints stay. It deletes the relationships first, then the
// nodes, each in transactions of Config.WipeBatchSize: deleting a node
// deletes its relationships with it, so a tag or document with a large
// fan-in would otherwise make one transaction of unbounded size, past
// the server's transaction memory. A transaction still too large for the
// server ([ErrTooLarge]: nodes with large properties) is tried again
// with half as many. deleted counts the nodes.
func (b *Backend) Wipe(ctx context.Context) (deleted int64, err error) {
	limit := int64(b.cfg.WipeBatchSize)
	for _, st := range []struct{ name, cypher string }{
		{"wipeRelationships", cypherWipeRelationships},
		{"wipe", cypherWipe},
	} {
		for {
			n, err := b.wipeBatch(ctx, st.name, st.cypher, limit)
			if errors.Is(err, ErrTooLarge) && limit > 1 {
				limit /= 2 // nodes with large properties take memory to delete
				continue
			}
			if err != nil {
				return deleted, b.fail("wipe", err)
			}
			if st.name == "wipe" {
				deleted += n
			}
			if n < limit {
				break
			}
		}
	}
	return deleted, nil
}

// WipeDocuments deletes what the graph holds of the documents called keys,
// as if no event of theirs had been applied, for a rebuild of their
// partition; the graph's other documents keep what they hold. First, for
// every key, its chunks and outgoing LINKS_TO and TAGGED relationships;
// then each node, or, where a document not in keys still links to it, its
// fields: it stays as the stub that link made of it. Tag nodes stay, as
// they do when a document drops a tag. Config.BatchSize keys per
// transaction, halved while a transaction is too large for the server
// ([ErrTooLarge]); deleted counts the nodes deleted. Run again after a
// failure, it finishes the work.
func (b *Backend) WipeDocuments(ctx context.Context, keys []string) (deleted int64, err error) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, st := range []struct{ name, cypher string }{
		{"wipeDocumentRelationships", cypherWipeDocumentRelationships},
		{"wipeDocuments", cypherWipeDocuments},
	} {
		size := b.cfg.BatchSize
		for lo := 0; lo < len(keys); {
			hi := min(lo+size, len(keys))
			n, err := b.count(ctx, st.name, hi-lo, st.cypher, map[string]any{"keys": keys[lo:hi]})
			if errors.Is(err, ErrTooLarge) && size > 1 {
				size /= 2
				continue
			}
			if err != nil {
				return deleted, b.fail("wipe documents", err)
			}
			if st.name == "wipeDocuments" {
				deleted += n
			}
			lo = hi
		}
	}
	return deleted, nil
}

// keysPage is how many keys a read transaction of ScanKeys reads.
const keysPage = 10000

// ScanKeys calls fn with the key of every document the graph holds
// anything of: those of the document nodes (stubs included), in key
// order, with stray "", then those of the chunk nodes no document node
// holds (its node gone, or made again as a stub), with stray the chunk's
// id; a key may come more than once. An error from fn ends the scan and
// is returned as it is.
func (b *Backend) ScanKeys(ctx context.Context, fn func(key, stray string) error) error {
	after := ""
	for {
		var page []string
		if err := b.run.ExecuteRead(ctx, func(t tx) error {
			page = page[:0]
			recs, err := t.Run(ctx, cypherDocumentKeys, map[string]any{"after": after, "limit": int64(keysPage)})
			if err != nil {
				return err
			}
			for _, rec := range recs {
				key, ok := rec["key"].(string)
				if !ok {
					return fmt.Errorf("documentKeys returned key=%T; want a string", rec["key"])
				}
				page = append(page, key)
			}
			return nil
		}); err != nil {
			return b.fail("scan keys", err)
		}
		if len(page) > 0 && page[0] <= after {
			return b.fail("scan keys", fmt.Errorf("a page after %q began with %q", after, page[0]))
		}
		for _, key := range page {
			if err := fn(key, ""); err != nil {
				return err
			}
		}
		if len(page) < keysPage {
			break
		}
		after = page[len(page)-1]
	}
	var stray [][2]string // key, id
	if err := b.run.ExecuteRead(ctx, func(t tx) error {
		stray = stray[:0]
		recs, err := t.Run(ctx, cypherStrayChunks, nil)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			key, kok := rec["key"].(string)
			id, iok := rec["id"].(string)
			if kok && iok {
				stray = append(stray, [2]string{key, id})
			}
		}
		return nil
	}); err != nil {
		return b.fail("scan keys", err)
	}
	for _, c := range stray {
		if err := fn(c[0], c[1]); err != nil {
			return err
		}
	}
	return nil
}

// WipeChunks deletes the chunk nodes of ids that no document node holds
// (ScanKeys' strays); every other chunk goes with its document in
// WipeDocuments. Config.BatchSize ids per transaction; deleted counts the
// chunks.
func (b *Backend) WipeChunks(ctx context.Context, ids []string) (deleted int64, err error) {
	for lo := 0; lo < len(ids); lo += b.cfg.BatchSize {
		hi := min(lo+b.cfg.BatchSize, len(ids))
		n, err := b.count(ctx, "wipeChunks", hi-lo, cypherWipeChunks, map[string]any{"ids": ids[lo:hi]})
		if err != nil {
			return deleted, b.fail("wipe chunks", err)
		}
		deleted += n
	}
	return deleted, nil
}

// wipeBatch runs one transaction of Wipe: cypher deletes up to limit
// relationships or nodes and answers how many.
func (b *Backend) wipeBatch(ctx context.Context, name, cypher string, limit int64) (int64, error) {
	return b.count(ctx, name, int(limit), cypher, map[string]any{"limit": limit})
}

// count runs cypher, the statement name of size keys or rows, with params
// in one write transaction, which answers one record: how many it
// deleted.
func (b *Backend) count(ctx context.Context, name string, size int, cypher string, params map[string]any) (int64, error) {
	var (
		n     int64
		large error
	)
	err := b.run.ExecuteWrite(ctx, func(t tx) error {
		large = nil
		recs, err := t.Run(ctx, cypher, params)
		if tooLarge(err) {
			large = err
			return errStopRetry
		}
		if err != nil {
			return err
		}
		if len(recs) != 1 {
			return fmt.Errorf("%s returned %d records; want 1", name, len(recs))
		}
		v, ok := recs[0]["deleted"].(int64)
		if !ok {
			return fmt.Errorf("%s returned deleted=%T; want an integer", name, recs[0]["deleted"])
		}
		n = v
		return nil
	})
	if large == nil && tooLarge(err) {
		large = err
	}
	if large != nil {
		return 0, fmt.Errorf("%s of %d: %w: %w", name, size, ErrTooLarge, large)
	}
	return n, err
}

// Close closes the driver and its connections.
func (b *Backend) Close() error {
	if b.driver == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := b.driver.Close(ctx); err != nil {
		return b.fail("close", err)
	}
	return nil
}
