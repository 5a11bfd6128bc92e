// Package backends opens the graph store a configuration names: Neo4j when
// a URL is set, the embedded graph under the data directory otherwise.
package backends

import (
	"context"
	"log/slog"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
)

// Env names of the graph settings.
const (
	EnvNeo4jURL      = "CONVERGE_NEO4J_URL"
	EnvNeo4jUser     = "CONVERGE_NEO4J_USER"
	EnvNeo4jPassword = "CONVERGE_NEO4J_PASSWORD" //nolint:gosec // the name of a variable, not a credential
)

// Config names the graph store.
type Config struct {
	Neo4jURL      string // bolt://, neo4j://, neo4j+s://; empty: the embedded graph
	Neo4jUser     string
	Neo4jPassword string
	Neo4jDatabase string
	Neo4jBatch    int
	DataDir       string // the embedded graph lives in DataDir/graph
}

// Flags binds the settings to flags (each with its environment variable);
// call the returned function after parsing.
func Flags(f *config.Flags) func() *Config {
	url := f.String("neo4j-url", EnvNeo4jURL, "", "Neo4j URL, bolt:// or neo4j:// (neo4j+s:// for TLS); empty: the embedded graph under -data-dir")
	user := f.String("neo4j-user", EnvNeo4jUser, "neo4j", "Neo4j user")
	password := f.String("neo4j-password", EnvNeo4jPassword, "", "Neo4j password")
	database := f.String("neo4j-database", "CONVERGE_NEO4J_DATABASE", "neo4j", "Neo4j database")
	batch := f.Int("neo4j-batch", "CONVERGE_NEO4J_BATCH", 100, "documents per Neo4j transaction")
	dataDir := f.String("data-dir", config.EnvDataDir, "./.converge", "directory of the embedded stores")
	return func() *Config {
		return &Config{Neo4jURL: *url, Neo4jUser: *user, Neo4jPassword: *password, Neo4jDatabase: *database,
			Neo4jBatch: *batch, DataDir: *dataDir}
	}
}

// Run is the graph projector process: it opens the live generation of the
// store, converges it to the stream with the projector runtime, rebuilds it
// on request (see [rebuild]), and serves /metrics, /healthz, /readyz,
// GET /v1/graph/{key}, verify's endpoints and /v1/admin/rebuild until ctx
// ends.
func Run(ctx context.Context, sc projector.ServiceConfig, c *Config, log *slog.Logger) error {
	return rebuild.RunService(ctx, sc, NewStores(c, log), log)
}

// Main is the projector-graph command: flags, then Run until SIGINT or
// SIGTERM. `converge projector-graph` runs the same.
func Main(args []string) error {
	return projector.Main(args, "projector-graph", "graph", "127.0.0.1:9104",
		func(f *config.Flags) func(context.Context, projector.ServiceConfig, *slog.Logger) error {
			store := Flags(f)
			return func(ctx context.Context, sc projector.ServiceConfig, log *slog.Logger) error {
				return Run(ctx, sc, store(), log)
			}
		})
}
