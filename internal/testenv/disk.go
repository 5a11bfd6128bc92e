//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Disk is a file system of its own that a test can fill to the last byte
// and empty again, as a neighbour's logs or a runaway backup do to a real
// disk: what a server keeps in Dir meets ENOSPC on its writes. It is a
// tmpfs, unmounted when the test ends.
type Disk struct {
	Dir     string // the mount point
	ballast string
}

// MountDisk mounts a tmpfs of size ("512m") under t's temporary
// directory; an error says why when this machine does not allow it
// (mounting takes CAP_SYS_ADMIN): the caller skips what needs it, saying
// so.
func MountDisk(t testing.TB, size string) (*Disk, error) {
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		return nil, fmt.Errorf("testenv: mount a tmpfs: %w", err)
	}
	d := &Disk{Dir: dir, ballast: filepath.Join(dir, ".ballast")}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("testenv: unmount %s: %v", dir, err)
		}
	})
	return d, nil
}

// Fill takes every free byte of the disk; it returns how many it took.
func (d *Disk) Fill() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.Dir, &st); err != nil {
		return 0, err
	}
	free := int64(st.Bavail) * st.Bsize
	f, err := os.OpenFile(d.ballast, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// fallocate takes the space at once; what is left by rounding is
	// written over until the disk refuses.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, free); err != nil && !errors.Is(err, syscall.ENOSPC) {
		return 0, fmt.Errorf("fallocate %d bytes: %w", free, err)
	}
	buf := make([]byte, 4096)
	if _, err := f.Seek(0, 2); err != nil {
		return 0, err
	}
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Free removes the ballast.
func (d *Disk) Free() error { return os.Remove(d.ballast) }
