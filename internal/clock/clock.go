package clock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Clock reads the wall clock.
type Clock interface {
	// Now is the wall time, without a monotonic reading.
	Now() time.Time
}

// EnvFaultFile names the file of the fault hook's offset (see the package
// doc). For tests only.
const EnvFaultFile = "CONVERGE_FAULT_CLOCK_FILE"

// Reread is how often, at most, the fault hook's file is read again.
const Reread = 100 * time.Millisecond

// Wall is this process's wall clock: the system's or, when [EnvFaultFile]
// is set, a [FaultFile] on the file it names, logging to slog's default
// logger. The variable is read at the first call.
func Wall() Clock { return wall() }

var wall = sync.OnceValue(func() Clock {
	if path := os.Getenv(EnvFaultFile); path != "" {
		return OpenFaultFile(path, nil)
	}
	return system{}
})

type system struct{}

func (system) Now() time.Time { return time.Now().Round(0) }

// Shifted is the system's wall clock moved by an offset that [Shifted.Jump]
// changes: a clock that steps, for tests. The zero value is the system's
// clock.
type Shifted struct {
	offset atomic.Int64
}

// NewShifted is the system's wall clock moved by offset.
func NewShifted(offset time.Duration) *Shifted {
	s := &Shifted{}
	s.offset.Store(int64(offset))
	return s
}

// Now is the system's wall time plus the offset.
func (s *Shifted) Now() time.Time { return time.Now().Round(0).Add(s.Offset()) }

// Offset is the clock's offset from the system's.
func (s *Shifted) Offset() time.Duration { return time.Duration(s.offset.Load()) }

// Jump steps the clock by d, forward or (d < 0) back.
func (s *Shifted) Jump(d time.Duration) { s.offset.Add(int64(d)) }

// maxFileBytes bounds what is read of the fault hook's file.
const maxFileBytes = 256

// FaultFile is the system's wall clock plus the offset a file holds (see
// the package doc): the fault hook of [EnvFaultFile].
type FaultFile struct {
	path  string
	log   *slog.Logger // nil: slog's default at the time of logging
	every time.Duration

	shift Shifted
	start time.Time    // monotonic origin of next
	next  atomic.Int64 // since start, when the file is due to be read again

	mu  sync.Mutex // held while reading the file
	bad string     // the last problem logged, until a good read
}

// OpenFaultFile reads the offset in path and returns the clock it moves.
// log (nil: slog's default) tells when the offset changes and, once per
// problem, when the file cannot be read.
func OpenFaultFile(path string, log *slog.Logger) *FaultFile {
	f := &FaultFile{path: path, log: log, every: Reread, start: time.Now()}
	f.mu.Lock()
	f.read()
	f.mu.Unlock()
	f.next.Store(int64(f.every))
	return f
}

// Now is the system's wall time plus the file's offset, read again when
// the last read is older than [Reread].
func (f *FaultFile) Now() time.Time {
	now := time.Now()
	if since := now.Sub(f.start); since >= time.Duration(f.next.Load()) {
		f.refresh(since)
	}
	return now.Round(0).Add(f.shift.Offset())
}

// Offset is the offset last read.
func (f *FaultFile) Offset() time.Duration { return f.shift.Offset() }

func (f *FaultFile) refresh(since time.Duration) {
	if !f.mu.TryLock() {
		return // being read: the offset read last serves meanwhile
	}
	defer f.mu.Unlock()
	if since < time.Duration(f.next.Load()) {
		return
	}
	f.read()
	f.next.Store(int64(since + f.every))
}

// read sets the offset from the file; f.mu is held.
func (f *FaultFile) read() {
	text, err := readSmall(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		text, err = "", nil
	}
	var offset time.Duration
	if err == nil {
		offset, err = ParseOffset(text)
	}
	if err != nil {
		if problem := err.Error(); problem != f.bad {
			f.bad = problem
			f.logger().Error("fault injection: the wall clock's offset file is unreadable; the last offset stays",
				"env", EnvFaultFile, "file", f.path, "offset", f.shift.Offset(), "err", err)
		}
		return
	}
	f.bad = ""
	if old := f.shift.Offset(); offset != old {
		f.shift.offset.Store(int64(offset))
		f.logger().Warn("fault injection: the wall clock steps", "env", EnvFaultFile, "file", f.path,
			"offset", offset, "step", offset-old)
	}
}

func (f *FaultFile) logger() *slog.Logger {
	if f.log != nil {
		return f.log
	}
	return slog.Default()
}

func readSmall(path string) (string, error) {
	file, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, maxFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxFileBytes {
		return "", fmt.Errorf("%s: more than %d bytes", path, maxFileBytes)
	}
	return string(b), nil
}

// ParseOffset reads the fault hook's file content: a Go duration, blanks
// around it ignored, a sign allowed; blank is 0.
func ParseOffset(text string) (time.Duration, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(text)
	if err != nil {
		return 0, fmt.Errorf("clock offset: %w", err)
	}
	return d, nil
}
