// Package graphprojector is the graph projector's service: it opens the
// graph store a configuration names (Neo4j when a URL is set, the embedded
// graph under the data directory otherwise) and runs the projector on it.
package graphprojector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/telemetry"
)

// Env names of the graph settings.
const (
	EnvNeo4jURL      = "CONVERGE_NEO4J_URL"
	EnvNeo4jUser     = "CONVERGE_NEO4J_USER"
	EnvNeo4jPassword = "CONVERGE_NEO4J_PASSWORD" //nolint:gosec // the name of a variable, not a credential
	EnvNeo4jCA       = "CONVERGE_NEO4J_CA"
)

// Config names the graph store.
type Config struct {
	Neo4jURL      string // bolt://, neo4j://, neo4j+s://; empty: the embedded graph
	Neo4jUser     string
	Neo4jPassword string
	// Neo4jCA is a PEM file of the CA certificates that the Neo4j
	// server's certificate chains to, trusted instead of the system's
	// roots; the URL's scheme must then be bolt+s or neo4j+s.
	Neo4jCA       string
	Neo4jDatabase string
	Neo4jBatch    int
	// Neo4jTxTimeout bounds each write transaction (neo4j.Config.TxTimeout).
	Neo4jTxTimeout time.Duration
	DataDir        string // the embedded graph lives in DataDir/graph
}

// Flags binds the settings to flags (each with its environment variable);
// call the returned function after parsing.
func Flags(f *config.Flags) func() *Config {
	url := f.String("neo4j-url", EnvNeo4jURL, "", "Neo4j URL, bolt:// or neo4j:// (neo4j+s:// for TLS); empty: the embedded graph under -data-dir")
	user := f.String("neo4j-user", EnvNeo4jUser, "neo4j", "Neo4j user")
	password := f.String("neo4j-password", EnvNeo4jPassword, "", "Neo4j password")
	ca := f.String("neo4j-ca", EnvNeo4jCA, "", "PEM file of the CA certificates the Neo4j server's certificate chains to, trusted instead of the system's roots (with a bolt+s:// or neo4j+s:// URL)")
	database := f.String("neo4j-database", "CONVERGE_NEO4J_DATABASE", neo4j.DefaultDatabase, "Neo4j database")
	batch := f.Int("neo4j-batch", "CONVERGE_NEO4J_BATCH", neo4j.DefaultBatchSize, "documents per Neo4j transaction")
	txTimeout := f.Duration("neo4j-tx-timeout", "CONVERGE_NEO4J_TX_TIMEOUT", neo4j.DefaultTxTimeout,
		"bound of each Neo4j write transaction: how long a writer that stopped mid-transaction (paused, cut off) can hold its locks")
	dataDir := f.String("data-dir", config.EnvDataDir, config.DefaultDataDir, "directory of the embedded stores")
	return func() *Config {
		return &Config{Neo4jURL: *url, Neo4jUser: *user, Neo4jPassword: *password, Neo4jCA: *ca, Neo4jDatabase: *database,
			Neo4jBatch: *batch, Neo4jTxTimeout: *txTimeout, DataDir: *dataDir}
	}
}

// Validate reports a configuration that cannot work: a -neo4j-ca that
// holds no certificate, or one given with a URL that does not verify the
// server's certificate.
func (c *Config) Validate() error {
	_, err := c.neo4jTLS()
	return err
}

// neo4jTLS is the TLS configuration that trusts Neo4jCA's certificates
// alone, or nil (the URL's scheme decides: the system's roots, or no
// TLS) without Neo4jCA.
func (c *Config) neo4jTLS() (*tls.Config, error) {
	if c.Neo4jCA == "" {
		return nil, nil
	}
	// A CA is for verifying: bolt:// has no TLS, and bolt+ssc:// verifies
	// nothing, so either would ignore it without a word.
	if u, err := url.Parse(c.Neo4jURL); err != nil || (u.Scheme != "bolt+s" && u.Scheme != "neo4j+s") {
		return nil, fmt.Errorf("graph: -neo4j-ca (%s) needs a -neo4j-url with the scheme bolt+s:// or neo4j+s://, which verify the server's certificate", EnvNeo4jCA)
	}
	cfg, err := telemetry.TrustCAFile(c.Neo4jCA)
	if err != nil {
		return nil, fmt.Errorf("graph: -neo4j-ca (%s): %w", EnvNeo4jCA, err)
	}
	return cfg, nil
}

// ServiceConfig is the graph projector's configuration.
type ServiceConfig struct {
	Projector projector.ServiceConfig
	Store     Config
}

// DefaultMetricsAddr is the graph projector's default -metrics-addr.
const DefaultMetricsAddr = "127.0.0.1:9104"

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	var part error
	if c.Projector.Partitions > 1 && c.Store.Neo4jURL == "" {
		part = errors.New("-partitions: the embedded graph lives in one process: partitions need Neo4j (-neo4j-url), which every instance shares")
	}
	return errors.Join(c.Projector.Validate(), c.Store.Validate(), part)
}

// Connections of the graph projector: NATS alone.
func (c ServiceConfig) Connections() service.Conns { return c.Projector.Connections() }

// ServiceFlags binds the graph projector's settings to flags and their
// environment variables; call the returned function after parsing.
func ServiceFlags(f *config.Flags) func() (ServiceConfig, error) {
	sc := projector.ServiceFlags(f, "graph", DefaultMetricsAddr)
	partitions := projector.PartitionsFlag(f)
	store := Flags(f)
	return func() (ServiceConfig, error) {
		p, err := sc()
		if err != nil {
			return ServiceConfig{}, err
		}
		p.Partitions = *partitions
		return ServiceConfig{Projector: p, Store: *store()}, nil
	}
}

// Run is the graph projector: it opens the live generation of the store
// cfg.Store names, converges it to the stream with the projector runtime
// over deps.NATS, rebuilds it on request (see [rebuild]), and serves
// /metrics, /healthz, /readyz, GET /v1/graph/{key}, verify's endpoints and
// /v1/admin/rebuild until ctx ends.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	deps = deps.WithDefaults()
	return rebuild.RunService(ctx, cfg.Projector, NewStores(&cfg.Store, deps.Log), deps)
}
