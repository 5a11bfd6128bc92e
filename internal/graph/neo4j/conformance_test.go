package neo4j

import (
	"os"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/graphtest"
)

// cypherDeleteAll empties the test database.
const cypherDeleteAll = `MATCH (n) DETACH DELETE n`

// TestConformance runs the suite every graph backend passes: against the
// model of the statements always (this checks the Go side: plans,
// batches, answers, decoding), and against a real Neo4j, which alone
// checks the Cypher, when CONVERGE_TEST_NEO4J_URL names one
// (bolt://127.0.0.1:7687 with docker-compose.test.yml;
// CONVERGE_TEST_NEO4J_USER and CONVERGE_TEST_NEO4J_PASSWORD default to
// neo4j and converge-test). Each subtest on the server starts by deleting
// everything in the database.
func TestConformance(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		graphtest.Run(t, func(t *testing.T) graph.Backend {
			return newTestBackend(newFakeRunner(), 7)
		})
	})
	t.Run("neo4j", func(t *testing.T) {
		url := os.Getenv("CONVERGE_TEST_NEO4J_URL")
		if url == "" {
			t.Skip("CONVERGE_TEST_NEO4J_URL is not set")
		}
		cfg := Config{URL: url, User: envOr("CONVERGE_TEST_NEO4J_USER", "neo4j"),
			Password: envOr("CONVERGE_TEST_NEO4J_PASSWORD", "converge-test")}
		graphtest.Run(t, func(t *testing.T) graph.Backend {
			b, err := New(ctx(), cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if err := b.run.ExecuteWrite(ctx(), func(tx tx) error {
				_, err := tx.Run(ctx(), cypherDeleteAll, nil)
				return err
			}); err != nil {
				_ = b.Close()
				t.Fatalf("emptying the database: %v", err)
			}
			return b
		})
	})
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
