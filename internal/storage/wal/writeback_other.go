//go:build !linux

package wal

import "os"

// writeBack is unsupported where sync_file_range(2) does not exist: the
// snapshot's final fsync alone makes it durable.
func writeBack(*os.File, int64, int64) error { return errWriteBackUnsupported }
