package embedded

import (
	"context"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/indextest"
)

func TestConformance(t *testing.T) {
	indextest.Run(t, func(t *testing.T) index.Backend {
		s, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestConformanceAfterReopen runs the suite against stores whose dimension
// was recorded, closed and replayed before the suite's writes, and which
// sync in the background.
func TestConformanceAfterReopen(t *testing.T) {
	indextest.Run(t, func(t *testing.T) index.Backend {
		dir := t.TempDir()
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Ensure(context.Background(), indextest.Dim); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s, err = Open(dir, Options{SyncEvery: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
