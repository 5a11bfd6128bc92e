package backends

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/verify"
)

// Stores are the generations of the graph for [rebuild]: directories of
// the embedded graph under the data directory (rebuilt blue/green), or the
// one Neo4j database (rebuilt in place, after a wipe).
type Stores struct {
	cfg  *Config
	dirs rebuild.Dirs
	log  *slog.Logger
}

var _ rebuild.Stores = (*Stores)(nil)

// NewStores returns the graph's generations as c configures them.
func NewStores(c *Config, log *slog.Logger) *Stores {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Stores{cfg: c, dirs: rebuild.Dirs{Root: c.DataDir, Base: "graph"}, log: log}
}

func (s *Stores) neo4j() bool { return s.cfg.Neo4jURL != "" }

// Live is the Neo4j database, or the embedded generation the pointer file
// names.
func (s *Stores) Live(context.Context) (string, error) {
	if s.neo4j() {
		return s.cfg.Neo4jDatabase, nil
	}
	return s.dirs.Live()
}

// Open opens (creating it if needed) the generation called name.
func (s *Stores) Open(ctx context.Context, name string) (*rebuild.Generation, error) {
	var backend graph.Backend
	var err error
	if s.neo4j() {
		c := s.cfg
		backend, err = neo4j.New(ctx, neo4j.Config{URL: c.Neo4jURL, User: c.Neo4jUser, Password: c.Neo4jPassword,
			Database: name, BatchSize: c.Neo4jBatch})
	} else {
		backend, err = embedded.Open(s.dirs.Path(name), embedded.Options{Logger: s.log.With("generation", name)})
	}
	if err != nil {
		return nil, err
	}
	p, err := graph.New(ctx, backend)
	if err != nil {
		_ = backend.Close()
		return nil, err
	}
	return &rebuild.Generation{
		Name:  name,
		Store: p,
		Routes: map[string]http.Handler{
			"GET /v1/graph/{key...}": graph.DocumentHandler(backend),
			"GET /v1/verify/": verify.Handler(verify.Graph, func(ctx context.Context) ([]verify.Doc, error) {
				return verify.ReadGraph(ctx, backend)
			}),
		},
		Close: backend.Close,
	}, nil
}

// Fresh names a new embedded generation (Neo4j is rebuilt in place).
func (s *Stores) Fresh() string { return s.dirs.Fresh() }

// InPlace is true with Neo4j, whose Community edition has one database.
func (s *Stores) InPlace() bool { return s.neo4j() }

// Wipe deletes the projection from the Neo4j database.
func (s *Stores) Wipe(ctx context.Context, g *rebuild.Generation) error {
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

// Activate switches the pointer file to name (Neo4j: nothing to do).
func (s *Stores) Activate(_ context.Context, name string) error {
	if s.neo4j() {
		return nil
	}
	return s.dirs.Activate(name)
}

// Drop deletes the embedded generation called name.
func (s *Stores) Drop(_ context.Context, name string) error {
	if s.neo4j() {
		return nil
	}
	return s.dirs.Drop(name)
}

// Describe names a generation.
func (s *Stores) Describe(name string) string {
	if s.neo4j() {
		return fmt.Sprintf("neo4j %s database %s", s.cfg.Neo4jURL, name)
	}
	return "embedded graph in " + s.dirs.Path(name)
}

// Describe names the store, for logs and reports.
func (c *Config) Describe() string {
	if c.Neo4jURL != "" {
		return fmt.Sprintf("neo4j %s database %s", c.Neo4jURL, c.Neo4jDatabase)
	}
	return "embedded graph under " + c.DataDir
}
