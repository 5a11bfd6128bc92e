package indexprojector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// Stores are the generations of the index for [rebuild], which rebuilds
// them blue/green: directories of the embedded index under the data
// directory, or Qdrant collections behind the configured collection name,
// which is then an alias.
type Stores struct {
	cfg      *Config
	opts     index.Options
	embedder embed.Embedder
	dirs     rebuild.Dirs
	log      *slog.Logger
	// tls is the Qdrant connections' TLS configuration (cfg.QdrantCA);
	// nil: the system's roots, or no TLS.
	tls *tls.Config
	// admin is a Qdrant connection for the alias and collection
	// operations; nil with the embedded index.
	admin *qdrant.Backend
}

var (
	_ rebuild.BlueGreen      = (*Stores)(nil)
	_ rebuild.PartitionWiper = (*Stores)(nil)
)

// NewStores returns the index's generations as c configures them. Close
// releases the Qdrant connection it may hold.
func NewStores(ctx context.Context, c *Config, opts index.Options, log *slog.Logger) (*Stores, error) {
	e, err := embed.New(c.Embed)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stores{cfg: c, opts: opts, embedder: e, dirs: rebuild.Dirs{Root: c.DataDir, Base: "index"}, log: log}
	if s.tls, err = c.qdrantTLS(); err != nil {
		return nil, err
	}
	if c.QdrantURL != "" {
		if s.admin, err = s.qdrant(ctx, c.QdrantCollection); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close releases the admin connection.
func (s *Stores) Close() error {
	if s.admin != nil {
		return s.admin.Close()
	}
	return nil
}

func (s *Stores) qdrant(ctx context.Context, collection string) (*qdrant.Backend, error) {
	c := s.cfg
	return qdrant.New(ctx, qdrant.Config{Addr: c.QdrantURL, APIKey: c.QdrantAPIKey, UseTLS: c.QdrantTLS, TLS: s.tls,
		Collection: collection, BatchSize: c.QdrantBatch, Parallel: c.QdrantParallel, Timeout: 30 * time.Second,
		Shards: c.QdrantShards, Replication: c.QdrantReplication, WriteConsistency: c.QdrantWriteConsistency})
}

// Live is the collection the alias names (the configured name itself when
// it is a plain collection, and <name>_1 before anything exists), or the
// embedded generation the pointer file names.
func (s *Stores) Live(ctx context.Context) (string, error) {
	if s.admin == nil {
		return s.dirs.Live()
	}
	alias := s.cfg.QdrantCollection
	target, err := s.admin.AliasTarget(ctx, alias)
	if err != nil || target != "" {
		return target, err
	}
	plain, err := s.admin.CollectionExists(ctx, alias)
	if err != nil {
		return "", err
	}
	if plain {
		return alias, nil
	}
	return alias + "_1", nil
}

// Open opens (creating it if needed) the generation called name.
func (s *Stores) Open(ctx context.Context, name string) (*rebuild.Generation, error) {
	var backend index.Backend
	var err error
	if s.admin != nil {
		backend, err = s.qdrant(ctx, name)
	} else {
		backend, err = embedded.Open(s.dirs.Path(name), embedded.Options{Logger: s.log.With("generation", name)})
	}
	if err != nil {
		return nil, err
	}
	opts := s.opts
	opts.ReadEmbedder = func(id embed.Identity) (embed.Embedder, error) { return embed.ForIdentity(s.cfg.Embed, id) }
	x, err := index.New(ctx, backend, s.embedder, opts)
	if err != nil {
		_ = backend.Close()
		return nil, err
	}
	stored, _, refusing := x.Embedder()
	if refusing != nil {
		s.log.Error("the generation's vectors were made by another embedder than the configured one: its writes are refused until `converge rebuild index` replaces it",
			"generation", name, "stored", stored.String(), "configured", embed.IdentityOf(s.embedder).String())
		if err := x.SearchError(); err != nil {
			s.log.Warn("its searches cannot be answered either", "generation", name, "err", err)
		}
	}
	if s.admin != nil && name != s.cfg.QdrantCollection {
		// The first generation gets its alias as soon as it exists.
		if target, err := s.admin.AliasTarget(ctx, s.cfg.QdrantCollection); err == nil && target == "" {
			if plain, err := s.admin.CollectionExists(ctx, s.cfg.QdrantCollection); err == nil && !plain {
				if err := s.admin.SwitchAlias(ctx, s.cfg.QdrantCollection, name); err != nil {
					_ = backend.Close()
					return nil, err
				}
			}
		}
	}
	return &rebuild.Generation{
		Name:  name,
		Store: x,
		Routes: map[string]http.Handler{
			"GET /v1/search": atleast.Handler(indexVersions(backend), index.SearchHandler(x)),
			"GET /v1/verify/": verify.Handler(verify.Index, func(ctx context.Context) ([]verify.Doc, error) {
				return verify.ReadIndex(ctx, backend, verify.CheckVectors(x.ReadEmbedder(), s.cfg.VerifyVectors))
			}, verify.WithEmbedder(stored)),
			"GET " + index.InfoPath: index.InfoHandler(name, x),
		},
		Close: backend.Close,
	}, nil
}

// Fresh names a new generation: <name>_<time>, or <name>_<time>_<n> when
// a collection of that name exists (one created in the same second, such
// as the live one right after a quick rebuild). Should Qdrant not answer,
// the name is returned unchecked.
func (s *Stores) Fresh() string {
	if s.admin == nil {
		return s.dirs.Fresh()
	}
	base := s.cfg.QdrantCollection + "_" + time.Now().UTC().Format("20060102t150405")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := base
	for i := 2; ; i++ {
		if exists, err := s.admin.CollectionExists(ctx, name); err != nil || !exists {
			return name
		}
		name = fmt.Sprintf("%s_%d", base, i)
	}
}

// Activate switches the alias (or the pointer file) to name. A plain
// collection under the alias's name (a store created before aliases were
// used) is dropped first, since an alias cannot share its name: searches
// fail for that moment, once.
func (s *Stores) Activate(ctx context.Context, name string) error {
	if s.admin == nil {
		return s.dirs.Activate(name)
	}
	alias := s.cfg.QdrantCollection
	plain, err := s.admin.CollectionExists(ctx, alias)
	if err != nil {
		return err
	}
	if plain {
		s.log.Warn("the index collection is not behind an alias; dropping it to create the alias (once)", "collection", alias, "new", name)
		if err := s.admin.DropCollection(ctx, alias); err != nil {
			return err
		}
	}
	return s.admin.SwitchAlias(ctx, alias, name)
}

// Drop deletes the generation called name.
func (s *Stores) Drop(ctx context.Context, name string) error {
	if s.admin == nil {
		return s.dirs.Drop(name)
	}
	return s.admin.DropCollection(ctx, name)
}

// WipePartition deletes from the live generation g every point of the
// documents of partition part of n: their keys are read from the markers
// and the chunk points. Only a Qdrant index runs in partitions.
func (s *Stores) WipePartition(ctx context.Context, g *rebuild.Generation, part, n int) error {
	x, ok := g.Store.(*index.Index)
	if !ok {
		return fmt.Errorf("wipe partition: generation %s is not an index", g.Name)
	}
	b, ok := x.Backend().(*qdrant.Backend)
	if !ok {
		return errors.New("wipe partition: only a Qdrant index runs in partitions")
	}
	seen := map[string]bool{}
	var keys []string
	if err := b.ScanKeys(ctx, func(key string) error {
		if !seen[key] && contract.Partition(key, n) == part {
			seen[key] = true
			keys = append(keys, key)
		}
		return nil
	}); err != nil {
		return err
	}
	err := b.WipeDocuments(ctx, keys)
	s.log.Info("index partition wiped for its rebuild", "collection", g.Name, "partition", part, "of", n, "documents", len(keys), "err", err)
	return err
}

// PartitionRefused is why no partition of g can be rebuilt alone: the
// generation refuses writes (its vectors are another embedder's), so a
// partition wiped would stay empty; a whole rebuild replaces it.
func (s *Stores) PartitionRefused(g *rebuild.Generation) error {
	if x, ok := g.Store.(*index.Index); ok {
		if _, _, refusing := x.Embedder(); refusing != nil {
			return fmt.Errorf("the index refuses writes: %w", refusing)
		}
	}
	return nil
}

// Describe names a generation.
func (s *Stores) Describe(name string) string {
	if s.admin != nil {
		return fmt.Sprintf("qdrant %s collection %s (alias %s)", s.cfg.QdrantURL, name, s.cfg.QdrantCollection)
	}
	return "embedded index in " + s.dirs.Path(name)
}

// Describe names the store, for logs and reports.
func (c *Config) Describe() string {
	if c.QdrantURL != "" {
		return fmt.Sprintf("qdrant %s collection %s", c.QdrantURL, c.QdrantCollection)
	}
	return "embedded index under " + c.DataDir
}

// indexVersions are the versions the index holds of keys: its markers (a
// withdrawn document's included).
func indexVersions(b index.Backend) atleast.Versions {
	return func(ctx context.Context, keys []string) (map[string]int64, error) {
		markers, err := b.Markers(ctx, keys)
		if err != nil {
			return nil, err
		}
		out := make(map[string]int64, len(markers))
		for key, m := range markers {
			out[key] = m.Version
		}
		return out, nil
	}
}
