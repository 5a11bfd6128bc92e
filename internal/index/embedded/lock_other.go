//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package embedded

import (
	"errors"
	"os"
	"runtime"
)

// The embedded index refuses to run where it cannot lock its directory:
// two writers would interleave their logs.
func tryLock(*os.File) (bool, error) {
	return false, errors.New("embedded index: directory locking is not supported on " + runtime.GOOS)
}

func unlock(*os.File) error { return nil }
