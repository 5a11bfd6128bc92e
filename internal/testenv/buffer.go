package testenv

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects what a service or a child process writes from several
// goroutines (a logger, a child's stdout and stderr) while the test reads
// it: a bytes.Buffer under a mutex.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Contains reports whether s was written.
func (b *Buffer) Contains(s string) bool { return strings.Contains(b.String(), s) }
