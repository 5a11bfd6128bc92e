package rebuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDirs(t *testing.T) {
	root := t.TempDir()
	d := Dirs{Root: root, Base: "index"}
	live, err := d.Live()
	if err != nil || live != "index" {
		t.Fatalf("Live without a pointer: %q, %v; want index", live, err)
	}
	fresh := d.Fresh()
	if !strings.HasPrefix(fresh, "index-") {
		t.Fatalf("Fresh: %q; want index-<time>", fresh)
	}
	if err := os.MkdirAll(d.Path(fresh), 0o755); err != nil {
		t.Fatal(err)
	}
	if again := d.Fresh(); again == fresh {
		t.Fatalf("Fresh named an existing directory again: %q", again)
	}
	if err := os.MkdirAll(d.Path("index"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := d.Activate(fresh); err != nil {
		t.Fatal(err)
	}
	if live, err := d.Live(); err != nil || live != fresh {
		t.Fatalf("Live after Activate: %q, %v; want %q", live, err, fresh)
	}
	if _, err := os.Stat(filepath.Join(root, "index.current.tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary pointer file remains: %v", err)
	}
	if err := d.Drop(fresh); err == nil || !strings.Contains(err.Error(), "live") {
		t.Errorf("Drop of the live generation: %v; want a refusal", err)
	}
	if err := d.Drop("index"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path("index")); !os.IsNotExist(err) {
		t.Errorf("the dropped generation remains: %v", err)
	}
	if err := d.Drop("index"); err != nil {
		t.Errorf("dropping a dropped generation: %v", err)
	}
	for _, bad := range []string{"graph", "../index", "index-/../../x", ""} {
		if err := d.Activate(bad); err == nil {
			t.Errorf("Activate(%q) accepted", bad)
		}
		if err := d.Drop(bad); err == nil {
			t.Errorf("Drop(%q) accepted", bad)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "index.current"), []byte("../../etc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Live(); err == nil || !strings.Contains(err.Error(), "index.current") {
		t.Errorf("Live with a corrupt pointer: %v; want an error naming the file", err)
	}
}
