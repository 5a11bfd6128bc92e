package graphprojector_test

import (
	"testing"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graph/neo4j"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
)

// noEnv is an environment without variables.
func noEnv(string) (string, bool) { return "", false }

// TestFlagDefaultsAreStoreDefaults checks that the graph projector's
// flags, given no value and no variable, give the settings a zero
// neo4j.Config takes (its own test checks that a zero Config takes these
// constants), and the index projector's data directory.
func TestFlagDefaultsAreStoreDefaults(t *testing.T) {
	f := config.NewFlagsIn("graph-projector", noEnv)
	take := graphprojector.ServiceFlags(f)
	if err := f.Parse([]string{"-nats-url", "y"}); err != nil {
		t.Fatal(err)
	}
	sc, err := take()
	if err != nil {
		t.Fatal(err)
	}
	got := sc.Store

	// Both projectors bind -data-dir; their defaults must agree.
	fi := config.NewFlagsIn("index-projector", noEnv)
	takeIndex := indexprojector.Flags(fi)
	if err := fi.Parse(nil); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		flag, whose string
		got, want   any
	}{
		{"neo4j-database", "a zero neo4j.Config's", got.Neo4jDatabase, neo4j.DefaultDatabase},
		{"neo4j-batch", "a zero neo4j.Config's", got.Neo4jBatch, neo4j.DefaultBatchSize},
		{"neo4j-tx-timeout", "a zero neo4j.Config's", got.Neo4jTxTimeout, neo4j.DefaultTxTimeout},
		{"data-dir", "the index projector's", got.DataDir, takeIndex().DataDir},
	} {
		if c.got != c.want {
			t.Errorf("-%s defaults to %v, %s to %v", c.flag, c.got, c.whose, c.want)
		}
	}
}
