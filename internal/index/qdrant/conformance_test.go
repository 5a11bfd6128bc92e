package qdrant_test

import (
	"crypto/rand"
	"os"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/indextest"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
)

// TestConformance runs the suite every index backend passes: against the
// in-process server always, and against a real Qdrant when
// CONVERGE_TEST_QDRANT_URL names its gRPC endpoint ("http://host:6334",
// "https://..." for TLS, or "host:port"; CONVERGE_TEST_QDRANT_API_KEY
// supplies a key). On a real server each subtest uses its own collection
// and drops it afterwards.
func TestConformance(t *testing.T) {
	t.Run("qdranttest", func(t *testing.T) {
		indextest.Run(t, func(t *testing.T) index.Backend {
			return open(t, qdranttest.Start(t), nil)
		})
	})
	t.Run("qdrant", func(t *testing.T) {
		raw := os.Getenv("CONVERGE_TEST_QDRANT_URL")
		if raw == "" {
			t.Skip("CONVERGE_TEST_QDRANT_URL is not set")
		}
		base := realConfig(t, raw, os.Getenv("CONVERGE_TEST_QDRANT_API_KEY"))
		indextest.Run(t, func(t *testing.T) index.Backend {
			cfg := base
			cfg.Collection = "converge_test_" + strings.ToLower(rand.Text()[:12])
			b, err := qdrant.New(ctx(), cfg)
			if err != nil {
				t.Fatalf("New(%s): %v", cfg.Addr, err)
			}
			t.Cleanup(func() { dropCollection(t, cfg) })
			return b
		})
	})
}

func realConfig(t *testing.T, addr, apiKey string) qdrant.Config {
	t.Helper()
	cfg := qdrant.Config{Addr: addr, APIKey: apiKey}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("CONVERGE_TEST_QDRANT_URL=%q: %v", addr, err)
	}
	return cfg
}

// dropCollection removes a test collection through a backend of its own.
func dropCollection(t *testing.T, cfg qdrant.Config) {
	b, err := qdrant.New(ctx(), cfg)
	if err != nil {
		t.Errorf("drop %s: %v", cfg.Collection, err)
		return
	}
	defer b.Close()
	if err := b.DropCollection(ctx(), cfg.Collection); err != nil {
		t.Errorf("drop %s: %v", cfg.Collection, err)
	}
}
