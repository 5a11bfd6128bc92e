// Package indexprojector is the index projector's service: it opens the
// index store a configuration names: a Qdrant collection when a Qdrant
// address is set, the embedded index under the
// data directory otherwise; and the embedder. It is shared by the index
// projector and the commands that read the index.
package indexprojector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
)

// Env names of the index settings.
const (
	EnvQdrantURL    = "CONVERGE_QDRANT_URL"
	EnvQdrantAPIKey = "CONVERGE_QDRANT_API_KEY" //nolint:gosec // the name of a variable, not a credential
	EnvQdrantCA     = "CONVERGE_QDRANT_CA"
	EnvEmbedURL     = "CONVERGE_EMBED_URL"
	EnvEmbedAPIKey  = "CONVERGE_EMBED_API_KEY" //nolint:gosec // the name of a variable, not a credential
)

// Config names the index store and the embedder.
type Config struct {
	QdrantURL    string // host:port of Qdrant's gRPC API; empty: the embedded index
	QdrantAPIKey string
	QdrantTLS    bool
	// QdrantCA is a PEM file of the CA certificates that the Qdrant
	// server's certificate chains to, trusted instead of the system's
	// roots; it implies QdrantTLS.
	QdrantCA         string
	QdrantCollection string
	QdrantBatch      int
	QdrantParallel   int
	// QdrantShards, QdrantReplication and QdrantWriteConsistency are the
	// cluster settings of the collections the projector creates (see
	// qdrant.Config).
	QdrantShards, QdrantReplication, QdrantWriteConsistency int
	DataDir                                                 string // the embedded index lives in DataDir/index
	Embed                                                   embed.Config
	// VerifyVectors: each verify embeds the chunks of 1 document in
	// VerifyVectors again and compares them with the stored vectors (1:
	// all; 0: none).
	VerifyVectors int
}

// Flags binds the settings to flags (each with its environment variable);
// call the returned function after parsing.
func Flags(f *config.Flags) func() *Config {
	qURL := f.String("qdrant-url", EnvQdrantURL, "", "Qdrant gRPC host:port (empty: the embedded index under -data-dir)")
	qKey := f.String("qdrant-api-key", EnvQdrantAPIKey, "", "Qdrant API key")
	qTLS := f.Bool("qdrant-tls", "CONVERGE_QDRANT_TLS", false, "connect to Qdrant over TLS")
	qCA := f.String("qdrant-ca", EnvQdrantCA, "", "PEM file of the CA certificates the Qdrant server's certificate chains to, trusted instead of the system's roots (implies -qdrant-tls)")
	qColl := f.String("qdrant-collection", "CONVERGE_QDRANT_COLLECTION", qdrant.DefaultCollection, "Qdrant collection (or alias)")
	qBatch := f.Int("qdrant-batch", "CONVERGE_QDRANT_BATCH", qdrant.DefaultBatchSize, "points per Qdrant upsert")
	qPar := f.Int("qdrant-parallel", "CONVERGE_QDRANT_PARALLEL", qdrant.DefaultParallel, "concurrent Qdrant upserts")
	qShards := f.Int("qdrant-shards", "CONVERGE_QDRANT_SHARDS", 0, "shards of a collection the projector creates, on a Qdrant cluster (its shard_number: a multiple of the nodes); 0: Qdrant's default, one")
	qRepl := f.Int("qdrant-replication", "CONVERGE_QDRANT_REPLICATION", 0, "copies of each shard of a collection the projector creates, on a Qdrant cluster (its replication_factor; 2 survives a node's loss); 0: Qdrant's default, one")
	qWC := f.Int("qdrant-write-consistency", "CONVERGE_QDRANT_WRITE_CONSISTENCY", 0, "copies of a shard that must confirm each write of a collection the projector creates (its write_consistency_factor, at most -qdrant-replication); 0: Qdrant's default, one")
	dataDir := f.String("data-dir", config.EnvDataDir, config.DefaultDataDir, "directory of the embedded stores")
	eURL := f.String("embed-url", EnvEmbedURL, "", "base URL of an OpenAI-compatible /v1/embeddings endpoint (empty: the local hash embedder)")
	eModel := f.String("embed-model", "CONVERGE_EMBED_MODEL", "", "embedding model (with -embed-url)")
	eKey := f.String("embed-api-key", EnvEmbedAPIKey, "", "embedding API key (with -embed-url)")
	eDim := f.Int("embed-dim", "CONVERGE_EMBED_DIM", 0, fmt.Sprintf("vector dimension: the model's (required with -embed-url), or the hash embedder's (default %d)", embed.DefaultHashDimension))
	eBatch := f.Int("embed-batch", "CONVERGE_EMBED_BATCH", embed.DefaultBatchSize, "texts per request to the embeddings endpoint: the size it serves best (with -embed-url)")
	eConc := f.Int("embed-concurrency", "CONVERGE_EMBED_CONCURRENCY", embed.DefaultConcurrency, "requests in flight at most to the embeddings endpoint, over every shard (with -embed-url); a 429's Retry-After pauses them all")
	vVec := f.Int("verify-vectors", "CONVERGE_VERIFY_VECTORS", 16, "each verify embeds the chunks of 1 document in N again and compares them with the stored vectors (1: all, 0: none)")
	return func() *Config {
		c := &Config{QdrantURL: *qURL, QdrantAPIKey: *qKey, QdrantTLS: *qTLS, QdrantCA: *qCA, QdrantCollection: *qColl,
			QdrantBatch: *qBatch, QdrantParallel: *qPar, QdrantShards: *qShards, QdrantReplication: *qRepl, QdrantWriteConsistency: *qWC, DataDir: *dataDir,
			Embed: embed.Config{URL: *eURL, Model: *eModel, APIKey: *eKey, Dimension: *eDim}, VerifyVectors: *vVec}
		if *eURL != "" {
			c.Embed.BatchSize, c.Embed.Concurrency = *eBatch, *eConc
		}
		return c
	}
}

// Validate reports a configuration that cannot work: a -qdrant-ca that
// holds no certificate, or one given with a plain http:// address.
func (c *Config) Validate() error {
	_, err := c.qdrantTLS()
	return err
}

// qdrantTLS is the TLS configuration that trusts QdrantCA's certificates
// alone, or nil (the system's roots, or no TLS) without QdrantCA.
func (c *Config) qdrantTLS() (*tls.Config, error) {
	if c.QdrantCA == "" {
		return nil, nil
	}
	if strings.HasPrefix(c.QdrantURL, "http://") {
		return nil, fmt.Errorf("index: -qdrant-ca (%s) is for TLS, and -qdrant-url %s is plain http://", EnvQdrantCA, c.QdrantURL)
	}
	cfg, err := telemetry.TrustCAFile(c.QdrantCA)
	if err != nil {
		return nil, fmt.Errorf("index: -qdrant-ca (%s): %w", EnvQdrantCA, err)
	}
	return cfg, nil
}

// ServiceConfig is the index projector's configuration.
type ServiceConfig struct {
	Projector projector.ServiceConfig
	Store     Config
	Options   index.Options
}

// DefaultMetricsAddr is the index projector's default -metrics-addr.
const DefaultMetricsAddr = "127.0.0.1:9103"

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	var part error
	if c.Projector.Partitions > 1 && c.Store.QdrantURL == "" {
		part = errors.New("-partitions: the embedded index lives in one process: partitions need Qdrant (-qdrant-url), which every instance shares")
	}
	return errors.Join(c.Projector.Validate(), c.Store.Validate(), part)
}

// Connections of the index projector: NATS alone.
func (c ServiceConfig) Connections() service.Conns { return c.Projector.Connections() }

// ServiceFlags binds the index projector's settings to flags and their
// environment variables; call the returned function after parsing.
func ServiceFlags(f *config.Flags) func() (ServiceConfig, error) {
	sc := projector.ServiceFlags(f, "index", DefaultMetricsAddr)
	partitions := projector.PartitionsFlag(f)
	reuse := f.Bool("reuse-vectors", "CONVERGE_INDEX_REUSE_VECTORS", false, "reuse the stored vectors of unchanged chunks (worth it with a remote embedder)")
	ahead := f.Bool("embed-ahead", "CONVERGE_EMBED_AHEAD", true, "with -embed-url and without -reuse-vectors: embed the next batch's chunks while the current one is written, so that the endpoint is not idle meanwhile")
	store := Flags(f)
	return func() (ServiceConfig, error) {
		p, err := sc()
		if err != nil {
			return ServiceConfig{}, err
		}
		p.Partitions = *partitions
		st := *store()
		return ServiceConfig{Projector: p, Store: st, Options: index.Options{ReuseVectors: *reuse, EmbedAhead: *ahead && st.Embed.URL != ""}}, nil
	}
}

// Run is the index projector: it opens the live generation of the store
// cfg.Store names, converges it to the stream with the projector runtime
// over deps.NATS, rebuilds it on request (see [rebuild]), and serves
// /metrics, /healthz, /readyz, GET /v1/search, verify's endpoints and
// /v1/admin/rebuild until ctx ends.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	deps = deps.WithDefaults()
	stores, err := NewStores(ctx, &cfg.Store, cfg.Options, deps.Log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: opening the store was cut short
		}
		return err
	}
	defer func() { _ = stores.Close() }()
	deps.Log.Info("index", "embedder", stores.embedder.Name(), "dimension", stores.embedder.Dimension())
	return rebuild.RunService(ctx, cfg.Projector, stores, deps)
}
