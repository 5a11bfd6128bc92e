package wal

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeBack writes f's bytes [off, off+n) to the device and waits for
// them, leaving the file's other pages and its metadata alone: a long
// snapshot write then never holds more than a window of dirty pages, which
// an fsync of the live log would otherwise have to wait behind.
func writeBack(f *os.File, off, n int64) error {
	return unix.SyncFileRange(int(f.Fd()), off, n,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}
