package wal

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// writeBack writes f's bytes [off, off+n) to the device and waits for
// them, leaving the file's other pages and its metadata alone: a long
// snapshot write then never holds more than a window of dirty pages, which
// an fsync of the live log would otherwise have to wait behind.
func writeBack(f *os.File, off, n int64) error {
	err := unix.SyncFileRange(int(f.Fd()), off, n,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ESPIPE), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
		return errWriteBackUnsupported
	default:
		// A write error (EIO, ENOSPC) is reported once, to whoever waits
		// first: here, not to the final fsync. It fails the snapshot.
		return fmt.Errorf("wal: write back the snapshot: %w", err)
	}
}
