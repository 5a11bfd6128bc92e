package neo4j

import (
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/graphtest"
	"github.com/converge-sync/converge/internal/testenv"
)

// TestConformance runs the suite every graph backend passes: against the
// model of the statements (this checks the Go side: plans, batches,
// answers, decoding), and against the real Neo4j server of the test run
// (testenv.LeaseNeo4j), which alone checks the Cypher. Each subtest on the
// server leases an emptied instance.
func TestConformance(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		graphtest.Run(t, func(t *testing.T) graph.Backend {
			return newTestBackend(newFakeRunner(), 7)
		})
	})
	t.Run("neo4j", func(t *testing.T) {
		graphtest.Run(t, func(t *testing.T) graph.Backend {
			return newServerBackend(t, Config{})
		})
	})
}

// newServerBackend connects to an emptied instance of the test server
// leased to t, with cfg's other settings; the backend is closed when t
// ends.
func newServerBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	n := testenv.LeaseNeo4j(t)
	cfg.URL, cfg.User, cfg.Password = n.URL, n.User, n.Password
	b, err := New(ctx(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
