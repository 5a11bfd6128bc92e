// Package waltest holds what the tests of the stores built on package wal
// share: opening a store for a test, the single-writer check, and the
// durability settings their benchmarks compare.
package waltest

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// Policy is a durability setting a store is measured under.
type Policy struct {
	Name    string
	Options wal.Options
}

// SyncPolicies are a sync before every write call returns, and a
// background sync every 100ms.
var SyncPolicies = []Policy{
	{"sync=call", wal.Options{}},
	{"sync=100ms", wal.Options{SyncEvery: 100 * time.Millisecond}},
}

// Open opens a store in dir with open, failing the test on an error, and
// closes the store when the test ends.
func Open[S io.Closer](t testing.TB, open func(string, wal.Options) (S, error), dir string, opts wal.Options) S {
	t.Helper()
	s, err := open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// ExpectLocked checks that a directory has a single writer: while holder
// has dir open, opening it again fails with [wal.ErrLocked] naming this
// process; once holder is closed, it opens.
func ExpectLocked[S io.Closer](t testing.TB, open func(string, wal.Options) (S, error), dir string, holder io.Closer) {
	t.Helper()
	s, err := open(dir, wal.Options{})
	if err == nil {
		_ = s.Close()
	}
	if !errors.Is(err, wal.ErrLocked) || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	Open(t, open, dir, wal.Options{})
}

// FileSize is the size of the file at path.
func FileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
