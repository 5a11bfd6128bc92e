package indexprojector_test

import (
	"testing"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/indexprojector"
)

// TestFlagDefaultsAreStoreDefaults checks that the index projector's
// flags, given no value and no variable, give the settings a zero
// qdrant.Config takes (its own test checks that a zero Config takes these
// constants). The graph projector's test compares the two -data-dir.
func TestFlagDefaultsAreStoreDefaults(t *testing.T) {
	f := config.NewFlagsIn("index-projector", func(string) (string, bool) { return "", false })
	take := indexprojector.ServiceFlags(f)
	if err := f.Parse([]string{"-nats-url", "y"}); err != nil {
		t.Fatal(err)
	}
	sc, err := take()
	if err != nil {
		t.Fatal(err)
	}
	got := sc.Store
	for _, c := range []struct {
		flag      string
		got, want any
	}{
		{"qdrant-collection", got.QdrantCollection, qdrant.DefaultCollection},
		{"qdrant-batch", got.QdrantBatch, qdrant.DefaultBatchSize},
		{"qdrant-parallel", got.QdrantParallel, qdrant.DefaultParallel},
	} {
		if c.got != c.want {
			t.Errorf("-%s defaults to %v, a zero qdrant.Config's to %v", c.flag, c.got, c.want)
		}
	}
}
