//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package wal

import (
	"errors"
	"os"
	"runtime"
)

// A log refuses to run where it cannot lock its directory: two writers
// would interleave their records.
func tryLock(*os.File) (bool, error) {
	return false, errors.New("wal: directory locking is not supported on " + runtime.GOOS)
}

func unlock(*os.File) error { return nil }
