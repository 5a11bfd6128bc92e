package neo4j

import "testing"

// TestDefaultsOfAZeroConfig checks that a zero Config takes the exported
// defaults, which the graph projector's flags take too (its own test
// compares them with the flags).
func TestDefaultsOfAZeroConfig(t *testing.T) {
	var c Config
	c.setDefaults()
	for _, d := range []struct {
		name      string
		got, want any
	}{
		{"Database", c.Database, DefaultDatabase},
		{"BatchSize", c.BatchSize, DefaultBatchSize},
		{"TxTimeout", c.TxTimeout, DefaultTxTimeout},
	} {
		if d.got != d.want {
			t.Errorf("a zero Config's %s is %v, not its default %v", d.name, d.got, d.want)
		}
	}
}
