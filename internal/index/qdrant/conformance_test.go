package qdrant_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/indextest"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
)

// TestConformance runs the suite every index backend passes: against the
// in-process model, and against a real Qdrant leased from testenv (which
// skips, loudly, where none can be had, and fails with CI=true). On the
// real server each subtest has a collection of its own, named after the
// lease's, which testenv drops afterwards.
func TestConformance(t *testing.T) {
	t.Run("qdranttest", func(t *testing.T) {
		indextest.Run(t, func(t *testing.T) index.Backend {
			return open(t, qdranttest.Start(t), nil)
		})
	})
	t.Run("qdrant", func(t *testing.T) {
		s := realServer(t)
		var n atomic.Int64
		indextest.Run(t, func(t *testing.T) index.Backend {
			collection := s.name(fmt.Sprint(n.Add(1)))
			return s.open(t, func(c *qdrant.Config) { c.Collection = collection })
		})
	})
}
