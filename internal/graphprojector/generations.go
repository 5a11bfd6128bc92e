package graphprojector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// NewStores returns the graph's generations for [rebuild] as c configures
// them: the one Neo4j database, rebuilt in place ([Neo4jStores]), or the
// directories of the embedded graph under the data directory, rebuilt
// blue/green ([EmbeddedStores]).
func NewStores(c *Config, log *slog.Logger) rebuild.Stores {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c.Neo4jURL != "" {
		return &Neo4jStores{cfg: c, log: log}
	}
	return &EmbeddedStores{dirs: rebuild.Dirs{Root: c.DataDir, Base: "graph"}, log: log}
}

// EmbeddedStores are the generations of the embedded graph: directories
// under the data directory, rebuilt blue/green.
type EmbeddedStores struct {
	dirs rebuild.Dirs
	log  *slog.Logger
}

var _ rebuild.BlueGreen = (*EmbeddedStores)(nil)

// Live is the generation the pointer file names.
func (s *EmbeddedStores) Live(context.Context) (string, error) { return s.dirs.Live() }

// Open opens (creating it if needed) the generation called name.
func (s *EmbeddedStores) Open(ctx context.Context, name string) (*rebuild.Generation, error) {
	backend, err := embedded.Open(s.dirs.Path(name), embedded.Options{Logger: s.log.With("generation", name)})
	if err != nil {
		return nil, err
	}
	return generation(ctx, name, backend)
}

// Fresh names a new generation.
func (s *EmbeddedStores) Fresh() string { return s.dirs.Fresh() }

// Activate switches the pointer file to name.
func (s *EmbeddedStores) Activate(_ context.Context, name string) error {
	return s.dirs.Activate(name)
}

// Drop deletes the generation called name.
func (s *EmbeddedStores) Drop(_ context.Context, name string) error { return s.dirs.Drop(name) }

// Describe names a generation.
func (s *EmbeddedStores) Describe(name string) string {
	return "embedded graph in " + s.dirs.Path(name)
}

// Neo4jStores are the one Neo4j database (the Community edition has no
// other), rebuilt in place after a wipe.
type Neo4jStores struct {
	cfg *Config
	log *slog.Logger
}

var (
	_ rebuild.InPlace        = (*Neo4jStores)(nil)
	_ rebuild.PartitionWiper = (*Neo4jStores)(nil)
)

// Live is the configured database.
func (s *Neo4jStores) Live(context.Context) (string, error) { return s.cfg.Neo4jDatabase, nil }

// Open connects to the database called name.
func (s *Neo4jStores) Open(ctx context.Context, name string) (*rebuild.Generation, error) {
	c := s.cfg
	tlsConfig, err := c.neo4jTLS()
	if err != nil {
		return nil, err
	}
	backend, err := neo4j.New(ctx, neo4j.Config{URL: c.Neo4jURL, User: c.Neo4jUser, Password: c.Neo4jPassword, TLS: tlsConfig,
		Database: name, BatchSize: c.Neo4jBatch, TxTimeout: c.Neo4jTxTimeout, Logger: s.log})
	if err != nil {
		return nil, err
	}
	return generation(ctx, name, backend)
}

// Wipe deletes the projection from the database g, which Open opened.
func (s *Neo4jStores) Wipe(ctx context.Context, g *rebuild.Generation) error {
	p, ok := g.Store.(*graph.Projection)
	if !ok {
		return fmt.Errorf("wipe: generation %s is not a graph projection", g.Name)
	}
	b, ok := p.Backend().(*neo4j.Backend)
	if !ok {
		return errors.New("wipe: only a Neo4j graph is rebuilt in place")
	}
	deleted, err := b.Wipe(ctx)
	s.log.Info("graph wiped for the rebuild", "nodes_deleted", deleted, "err", err)
	return err
}

// WipePartition deletes from the database g what it holds of the
// documents of partition part of n: their keys are read from the document
// and chunk nodes; a node another partition's document links to stays, a
// stub.
func (s *Neo4jStores) WipePartition(ctx context.Context, g *rebuild.Generation, part, n int) error {
	p, ok := g.Store.(*graph.Projection)
	if !ok {
		return fmt.Errorf("wipe partition: generation %s is not a graph projection", g.Name)
	}
	b, ok := p.Backend().(*neo4j.Backend)
	if !ok {
		return errors.New("wipe partition: only a Neo4j graph runs in partitions")
	}
	var keys, stray []string
	if err := b.ScanKeys(ctx, func(key, chunk string) error {
		switch {
		case key == "" || contract.Partition(key, n) != part:
		case chunk == "":
			keys = append(keys, key)
		default:
			stray = append(stray, chunk)
		}
		return nil
	}); err != nil {
		return err
	}
	chunks, err := b.WipeChunks(ctx, stray)
	if err != nil {
		return err
	}
	deleted, err := b.WipeDocuments(ctx, keys)
	s.log.Info("graph partition wiped for its rebuild", "partition", part, "of", n, "documents", len(keys), "document_nodes_deleted", deleted,
		"chunks_without_their_document_deleted", chunks, "err", err)
	return err
}

// PartitionRefused is nil: the graph's partitions can always be rebuilt
// alone.
func (s *Neo4jStores) PartitionRefused(*rebuild.Generation) error { return nil }

// Describe names the database.
func (s *Neo4jStores) Describe(name string) string {
	return fmt.Sprintf("neo4j %s database %s", s.cfg.Neo4jURL, name)
}

// generation is the graph projection over backend, named name, with its
// read routes; closing it closes backend.
func generation(ctx context.Context, name string, backend graph.Backend) (*rebuild.Generation, error) {
	p, err := graph.New(ctx, backend)
	if err != nil {
		_ = backend.Close()
		return nil, err
	}
	return &rebuild.Generation{
		Name:  name,
		Store: p,
		Routes: map[string]http.Handler{
			"GET /v1/graph/{key...}": atleast.Handler(graphVersions(backend), graph.DocumentHandler(backend)),
			"GET /v1/verify/": verify.Handler(verify.Graph, func(ctx context.Context) ([]verify.Doc, error) {
				return verify.ReadGraph(ctx, backend)
			}),
		},
		Close: backend.Close,
	}, nil
}

// Describe names the store, for logs and reports.
func (c *Config) Describe() string {
	if c.Neo4jURL != "" {
		return fmt.Sprintf("neo4j %s database %s", c.Neo4jURL, c.Neo4jDatabase)
	}
	return "embedded graph under " + c.DataDir
}

// graphVersions are the versions the graph holds of keys (a withdrawn
// document's node keeps its version; a stub, made by a link, has none).
func graphVersions(b graph.Backend) atleast.Versions {
	return func(ctx context.Context, keys []string) (map[string]int64, error) {
		out := make(map[string]int64, len(keys))
		for _, key := range keys {
			v, ok, err := b.Document(ctx, key)
			if err != nil {
				return nil, err
			}
			if ok && !v.Stub {
				out[key] = v.Version
			}
		}
		return out, nil
	}
}
