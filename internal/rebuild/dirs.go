package rebuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/storage/atomicfile"
)

// Dirs keeps the generations of an embedded store as sibling directories
// under Root: the first is Root/Base, later ones Root/Base-<time>. The file
// Root/Base.current names the live one; without it, Base is live. A
// generation is made live by renaming a new pointer file into place, so a
// crash leaves either the old pointer or the new one.
type Dirs struct {
	Root string // the data directory
	Base string // "index", "graph"
}

func (d Dirs) pointer() string { return filepath.Join(d.Root, d.Base+".current") }

// Path is the directory of the generation called name.
func (d Dirs) Path(name string) string { return filepath.Join(d.Root, name) }

// Live names the live generation.
func (d Dirs) Live() (string, error) {
	b, err := os.ReadFile(d.pointer())
	if errors.Is(err, fs.ErrNotExist) {
		return d.Base, nil
	}
	if err != nil {
		return "", fmt.Errorf("rebuild: read %s: %w", d.pointer(), err)
	}
	name := strings.TrimSpace(string(b))
	if err := d.valid(name); err != nil {
		return "", fmt.Errorf("rebuild: %s: %w", d.pointer(), err)
	}
	return name, nil
}

func (d Dirs) valid(name string) error {
	ours := name == d.Base || strings.HasPrefix(name, d.Base+"-")
	if !ours || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("%q is not a generation of %s", name, d.Base)
	}
	return nil
}

// Fresh names a generation whose directory does not exist.
func (d Dirs) Fresh() string {
	base := d.Base + "-" + time.Now().UTC().Format("20060102T150405Z")
	name := base
	for i := 2; ; i++ {
		if _, err := os.Stat(d.Path(name)); errors.Is(err, fs.ErrNotExist) {
			return name
		}
		name = fmt.Sprintf("%s.%d", base, i)
	}
}

// Activate makes name the live generation: the pointer file is written
// beside, synced, renamed into place, and the directory synced.
func (d Dirs) Activate(name string) error {
	if err := d.valid(name); err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	if live, err := d.Live(); err == nil && live == name {
		return nil
	}
	err := atomicfile.Write(d.pointer(), []byte(name+"\n"), 0o600)
	if err != nil {
		return fmt.Errorf("rebuild: activate %s: %w", name, err)
	}
	return nil
}

// Drop removes the directory of the generation called name, which must not
// be the live one.
func (d Dirs) Drop(name string) error {
	if err := d.valid(name); err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	live, err := d.Live()
	if err != nil {
		return err
	}
	if live == name {
		return fmt.Errorf("rebuild: refusing to drop %s: it is the live generation", d.Path(name))
	}
	if err := os.RemoveAll(d.Path(name)); err != nil {
		return fmt.Errorf("rebuild: drop %s: %w", d.Path(name), err)
	}
	return atomicfile.SyncDir(d.Root)
}
