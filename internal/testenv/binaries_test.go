package testenv

import (
	"os"
	"slices"
	"testing"
)

func TestBuildBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every command")
	}
	b := BuildBinaries(t)
	for _, name := range []string{"converge", "writer", "relay", "projector-index", "projector-graph"} {
		if !slices.Contains(b.Names, name) {
			t.Errorf("no %s among %v", name, b.Names)
		}
		if fi, err := os.Stat(b.Path(name)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s: %v %v", name, fi, err)
		}
	}
	var again *Binaries
	t.Run("shared", func(t *testing.T) { again = BuildBinaries(t) })
	if again != b {
		t.Errorf("a second test built again: %s, then %s", b.Dir, again.Dir)
	}
	if _, err := os.Stat(b.Dir); err != nil {
		t.Errorf("the build went when a second test ended: %v", err)
	}
}
