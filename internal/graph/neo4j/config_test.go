package neo4j

import (
	"crypto/tls"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{URL: "bolt://localhost:7687"}, true},
		{Config{URL: "neo4j://db.example:7687", BatchSize: 1}, true},
		{Config{URL: "neo4j+s://db.example", TLS: &tls.Config{MinVersion: tls.VersionTLS13}}, true},
		{Config{URL: "bolt+ssc://db.example:7687"}, true},
		{Config{URL: ""}, false},
		{Config{URL: "http://localhost:7474"}, false},
		{Config{URL: "bolt://"}, false},
		{Config{URL: "bolt://neo4j:secret@localhost:7687"}, false},
		{Config{URL: "bolt://localhost:7687", TLS: &tls.Config{}}, false},
		{Config{URL: "bolt://localhost:7687", BatchSize: MaxBatchSize + 1}, false},
		{Config{URL: "bolt://localhost:7687", BatchSize: -1}, false},
		{Config{URL: "bolt://localhost:7687", WipeBatchSize: MaxWipeBatchSize + 1}, false},
		{Config{URL: "bolt://localhost:7687", WipeBatchSize: -1}, false},
		{Config{URL: "bolt://localhost:7687", WipeBatchSize: MaxWipeBatchSize}, true},
		{Config{URL: "bolt://localhost:7687", MaxRetryTime: -1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{URL: "bolt://localhost"}
	c.setDefaults()
	if c.Database != "neo4j" || c.BatchSize != 100 || c.MaxRetryTime != defaultMaxRetryTime {
		t.Fatalf("defaults %+v", c)
	}
}

func TestAgentVersion(t *testing.T) {
	for _, c := range []struct {
		agent        string
		major, minor int
		ok           bool
	}{
		{"Neo4j/5.26.1", 5, 26, true},
		{"Neo4j/5.3.0", 5, 3, true},
		{"Neo4j/4.4.30", 4, 4, true},
		{"Neo4j/2025.01.0", 2025, 1, true},
		{"Neo4j/dev", 0, 0, false},
		{"Memgraph/2.0", 0, 0, false},
	} {
		major, minor, ok := agentVersion(c.agent)
		if major != c.major || minor != c.minor || ok != c.ok {
			t.Errorf("agentVersion(%q) = %d, %d, %v", c.agent, major, minor, ok)
		}
	}
}

// New fails with a clear error when nothing listens.
func TestNewUnreachable(t *testing.T) {
	_, err := New(ctx(), Config{URL: "bolt://127.0.0.1:1", MaxRetryTime: 1})
	if err == nil || !strings.Contains(err.Error(), "cannot connect to bolt://127.0.0.1:1") {
		t.Fatalf("New against a closed port: %v", err)
	}
}
