package embedded

import (
	"testing"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/graph/graphtest"
)

// TestConformance runs the suite every graph backend passes.
func TestConformance(t *testing.T) {
	graphtest.Run(t, func(t *testing.T) graph.Backend { return openStore(t, t.TempDir(), Options{}) })
}
