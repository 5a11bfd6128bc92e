package qdrant

import "testing"

// TestDefaultsOfAZeroConfig checks that a zero Config takes the exported
// defaults, which the index projector's flags take too (its own test
// compares them with the flags).
func TestDefaultsOfAZeroConfig(t *testing.T) {
	var c Config
	c.setDefaults()
	for _, d := range []struct {
		name      string
		got, want any
	}{
		{"Collection", c.Collection, DefaultCollection},
		{"BatchSize", c.BatchSize, DefaultBatchSize},
		{"Parallel", c.Parallel, DefaultParallel},
		{"Timeout", c.Timeout, DefaultTimeout},
	} {
		if d.got != d.want {
			t.Errorf("a zero Config's %s is %v, not its default %v", d.name, d.got, d.want)
		}
	}
}
