package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// State is a store's in-memory state as its [Log] sees it.
type State interface {
	// Lock and Unlock take the store's lock over its state for writing.
	// The store holds it while it appends a record and applies the
	// record's change, so the log's order is the order in which the
	// changes are observed; a compaction holds it while it starts the next
	// log and calls Capture.
	sync.Locker
	// Capture returns the state as of the moment it is called, to be
	// written as a snapshot without the lock held (see [Snapshot]).
	Capture() (Snapshot, error)
	// Replayer rebuilds the state at Open.
	Replayer
}

// Replayer rebuilds a store's state from its files at [Open], before any
// other call: the snapshot's parts in order, then every log record after
// it. An error makes Open fail with a [*CorruptError] at the record.
type Replayer interface {
	// SnapshotHeader receives the store's fields of the snapshot's header
	// record ([Snapshot.Header]).
	SnapshotHeader(fields []byte) error
	// SnapshotRecord applies one record of the snapshot.
	SnapshotRecord(payload []byte) error
	// SnapshotEnd receives the store's fields of the snapshot's end record
	// ([Snapshot.End]), to check what was loaded.
	SnapshotEnd(fields []byte) error
	// LogRecord applies one record of a log.
	LogRecord(payload []byte) error
}

// Log is the durable half of a store: the log files it appends its records
// to, their syncing, their compaction into a snapshot, and the lock on the
// directory. See the package documentation for the order of writes.
type Log struct {
	dir      string
	format   Format
	opts     Options
	logger   *slog.Logger
	state    State
	lockFile *os.File
	done     chan struct{} // closed by Close to stop background work
	wg       sync.WaitGroup

	// syncMu serialises syncs of the log with its rotation and with Close.
	// It is taken before state, and state before mu.
	syncMu sync.Mutex
	synced int64 // the value of written at the last successful sync

	// compactMu serialises compactions.
	compactMu sync.Mutex

	closing atomic.Bool // Close has begun; set with mu held

	mu          sync.Mutex
	closed      bool  // Close has closed the files
	failed      error // a write or sync whose outcome on disk is unknown; sticky
	file        *os.File
	seq         uint64
	size        int64 // bytes in file
	logBytes    int64 // bytes in the logs the snapshot does not cover
	written     int64 // bytes appended since Open, over all logs
	nextCompact int64 // logBytes at which a compaction starts
	compacting  bool  // a background compaction is running
}

// Open opens the log in dir, creating the directory if needed, locks it,
// and replays its snapshot and logs into state. It fails with [ErrLocked]
// if another Log has dir open, and with a [*CorruptError] if a file is
// damaged other than by a torn final record, which is truncated away.
func Open(dir string, format Format, state State, opts Options) (*Log, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := format.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	lockFile, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{
		dir:      dir,
		format:   format,
		opts:     opts,
		logger:   opts.Logger.With("dir", dir, "format", format.Magic),
		state:    state,
		lockFile: lockFile,
		done:     make(chan struct{}),
	}
	if err := l.load(state); err != nil {
		if l.file != nil {
			_ = l.file.Close()
		}
		_ = unlock(lockFile)
		_ = lockFile.Close()
		return nil, err
	}
	l.synced = l.written
	if opts.SyncEvery > 0 {
		l.wg.Add(1)
		go l.syncLoop()
	}
	return l, nil
}

// load reads the snapshot, then the logs it does not cover, in order.
func (l *Log) load(r Replayer) error {
	tmp := filepath.Join(l.dir, TempSnapshotName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: remove unfinished snapshot: %w", err)
	}
	nextSeq := uint64(1)
	snapPath := filepath.Join(l.dir, SnapshotName)
	f, err := os.Open(snapPath)
	switch {
	case err == nil:
		nextSeq, err = l.readSnapshot(f, snapPath, r)
		_ = f.Close()
		if err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("wal: %w", err)
	}
	l.nextCompact = max(l.opts.CompactBytes, l.snapshotSize())

	seqs, err := ListLogs(l.dir)
	if err != nil {
		return err
	}
	var replay []uint64
	for _, seq := range seqs {
		if seq < nextSeq {
			// Covered by the snapshot: a compaction stopped before removing it.
			if err := os.Remove(filepath.Join(l.dir, LogName(seq))); err != nil {
				return fmt.Errorf("wal: remove compacted log: %w", err)
			}
			continue
		}
		if want := nextSeq + uint64(len(replay)); seq != want {
			return fmt.Errorf("wal: %s: log %s is missing (found %s)", l.dir, LogName(want), LogName(seq))
		}
		replay = append(replay, seq)
	}
	for i, seq := range replay {
		if err := l.replayLog(seq, i == len(replay)-1, r); err != nil {
			return err
		}
	}
	if len(replay) == 0 {
		return l.startLog(nextSeq)
	}
	last := replay[len(replay)-1]
	path := filepath.Join(l.dir, LogName(last))
	if l.size == 0 {
		// Not even the log's header reached the disk: start it again.
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		return l.startLog(last)
	}
	l.file, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	l.seq = last
	return nil
}

func (l *Log) snapshotSize() int64 {
	fi, err := os.Stat(filepath.Join(l.dir, SnapshotName))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// replayLog applies one log's records. Only the last log may end in a torn
// record, which is truncated away; every earlier one was synced before the
// next was created.
func (l *Log) replayLog(seq uint64, last bool, r Replayer) error {
	path := filepath.Join(l.dir, LogName(seq))
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	rr, err := NewReader(f, path)
	if err != nil {
		return err
	}
	header := false
	for {
		off := rr.Offset()
		payload, err := rr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, ErrTorn) {
			if !last {
				return rr.Corrupt("incomplete record in a log that is not the last")
			}
			if err := truncateTail(path, rr.Offset()); err != nil {
				return err
			}
			l.logger.Warn("wal: dropped a torn record at the end of the log",
				"path", path, "offset", rr.Offset(), "bytes", rr.Size()-rr.Offset())
			break
		}
		if err != nil {
			return err
		}
		if !header {
			if err := l.checkLogHeader(payload, seq); err != nil {
				return &CorruptError{Path: path, Offset: off, Reason: err.Error()}
			}
			header = true
			continue
		}
		if err := r.LogRecord(payload); err != nil {
			return &CorruptError{Path: path, Offset: off, Reason: err.Error()}
		}
	}
	if !header && !last {
		return &CorruptError{Path: path, Offset: 0, Reason: "empty log that is not the last"}
	}
	l.logBytes += rr.Offset()
	l.written += rr.Offset()
	if last {
		l.size = rr.Offset()
	}
	return nil
}

func (l *Log) checkLogHeader(payload []byte, seq uint64) error {
	d := NewDecoder(payload)
	if d.Byte() != KindLogHeader {
		return errors.New("the log does not start with its own header")
	}
	got := l.format.readHeader(d)
	if err := d.Finish(); err != nil {
		return err
	}
	if got != seq {
		return errors.New("the log does not start with its own header")
	}
	return nil
}

func (l *Log) startLog(seq uint64) error {
	f, n, err := createLog(l.dir, l.format, seq)
	if err != nil {
		return err
	}
	l.file, l.seq, l.size = f, seq, n
	l.logBytes += n
	l.written += n
	return nil
}

// Seq is the sequence number of the log being appended to.
func (l *Log) Seq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// Writable reports why an append would be refused: the Log is closing, or
// an earlier write or sync failed and the store must be reopened.
func (l *Log) Writable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writableLocked()
}

// Closed reports whether Close has been called.
func (l *Log) Closed() bool { return l.closing.Load() }

func (l *Log) writableLocked() error {
	if l.closing.Load() {
		return ErrClosed
	}
	if l.failed != nil {
		return fmt.Errorf("wal: an earlier write failed, reopen the store: %w", l.failed)
	}
	return nil
}

// Append writes a record sealed by [Seal] to the log. The caller holds
// the state's lock and applies the record's change after Append succeeds. It
// returns the log position to pass to [Log.Commit].
func (l *Log) Append(rec []byte) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.writableLocked(); err != nil {
		return 0, err
	}
	n, err := l.file.Write(rec)
	if err != nil {
		// A partial record followed by later ones would read back as
		// corruption: cut it off, or refuse further writes.
		err = fmt.Errorf("wal: append to %s: %w", l.file.Name(), err)
		if terr := l.file.Truncate(l.size); terr != nil {
			l.failed = errors.Join(err, terr)
		}
		return 0, err
	}
	l.size += int64(n)
	l.logBytes += int64(n)
	l.written += int64(n)
	l.maybeCompactLocked()
	return l.written, nil
}

// Write makes one change to the state the log records. With mu (the
// state's lock) held, plan decides the change and returns its record and
// how to apply it in memory (a nil record: nothing to write); the record is
// appended and, once appended, applied. With commit, everything appended so
// far (this record, and those of earlier calls that did not sync) is then
// committed ([Log.Commit]) after mu is released, so that writers waiting
// for a sync do not hold the state's lock.
func (l *Log) Write(mu sync.Locker, plan func() (rec []byte, apply func(), err error), commit bool) error {
	mu.Lock()
	if err := l.Writable(); err != nil {
		mu.Unlock()
		return err
	}
	rec, apply, err := plan()
	if err != nil {
		mu.Unlock()
		return err
	}
	var end int64
	if rec != nil {
		if end, err = l.Append(rec); err == nil {
			apply()
		}
	} else if commit {
		l.mu.Lock()
		end = l.written // what earlier calls appended
		l.mu.Unlock()
	}
	mu.Unlock()
	if err != nil || !commit {
		return err
	}
	return l.Commit(end)
}

// Commit makes the records appended up to position end durable when every
// write call is synced ([Options.SyncEvery] zero); otherwise the
// background loop syncs them. The caller must not hold the state's lock:
// writers that commit while a sync runs share the next one.
func (l *Log) Commit(end int64) error {
	if l.opts.SyncEvery > 0 {
		return nil
	}
	return l.syncTo(end)
}

// Unsynced is how many bytes were appended since the last successful sync.
func (l *Log) Unsynced() int64 {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written - l.synced
}

// syncTo syncs the log if it has not been synced up to position target.
func (l *Log) syncTo(target int64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced >= target {
		return nil
	}
	l.mu.Lock()
	f, written, failed, closed := l.file, l.written, l.failed, l.closed
	l.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("wal: log not synced: %w", failed)
	}
	if closed {
		return ErrClosed
	}
	if err := f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty pages:
		// nothing written since the last good sync can be trusted.
		err = fmt.Errorf("wal: sync %s: %w", f.Name(), err)
		l.mu.Lock()
		if l.failed == nil {
			l.failed = err
		}
		l.mu.Unlock()
		return err
	}
	l.synced = written
	return nil
}

func (l *Log) syncLoop() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.SyncEvery)
	defer t.Stop()
	reported := false
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		l.mu.Lock()
		written := l.written
		l.mu.Unlock()
		if err := l.syncTo(written); err != nil && !reported && !errors.Is(err, ErrClosed) {
			l.logger.Error("wal: background sync failed; writes are refused until the store is reopened", "err", err)
			reported = true
		}
	}
}

// Rotate syncs the log and starts the next one, without a snapshot: the
// records stay in the older log until a compaction covers them.
func (l *Log) Rotate() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	_, _, err := l.rotateLocked()
	return err
}

// rotateLocked syncs and closes the current log and starts the next; syncMu
// is held. It returns the new log's sequence number and the bytes of the
// logs before it.
func (l *Log) rotateLocked() (next uint64, covered int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.writableLocked(); err != nil {
		return 0, 0, err
	}
	if err := l.file.Sync(); err != nil {
		l.failed = fmt.Errorf("wal: sync %s: %w", l.file.Name(), err)
		return 0, 0, l.failed
	}
	l.synced = l.written
	next = l.seq + 1
	f, n, err := createLog(l.dir, l.format, next)
	if err != nil {
		return 0, 0, err
	}
	covered = l.logBytes
	if err := l.file.Close(); err != nil {
		// Already synced: nothing is lost.
		l.logger.Warn("wal: close rotated log", "err", err)
	}
	l.file, l.seq, l.size = f, next, n
	l.logBytes += n
	l.written += n
	l.synced = l.written
	return next, covered, nil
}

// Close stops background work, syncs the log and releases the directory.
// It reports a failed sync or write whose outcome on disk is unknown.
// Calls after the first return nil.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closing.Load() {
		l.mu.Unlock()
		return nil
	}
	l.closing.Store(true)
	close(l.done)
	l.mu.Unlock()
	l.wg.Wait()

	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	if l.failed == nil {
		if err := l.file.Sync(); err != nil {
			l.failed = fmt.Errorf("wal: sync %s: %w", l.file.Name(), err)
		} else {
			l.synced = l.written
		}
	}
	if l.failed != nil {
		// Writes acknowledged since the last good sync may be lost.
		errs = append(errs, l.failed)
	}
	if err := l.file.Close(); err != nil {
		errs = append(errs, fmt.Errorf("wal: %w", err))
	}
	if err := unlock(l.lockFile); err != nil {
		errs = append(errs, fmt.Errorf("wal: unlock: %w", err))
	}
	if err := l.lockFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("wal: %w", err))
	}
	l.closed = true
	return errors.Join(errs...)
}

// stopped is polled by a compaction between the records it writes.
func (l *Log) stopped(ctx context.Context) error {
	select {
	case <-l.done:
		return ErrClosed
	default:
		return ctx.Err()
	}
}
