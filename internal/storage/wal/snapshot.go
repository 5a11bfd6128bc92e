package wal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/converge-sync/converge/internal/storage/atomicfile"
)

// Snapshot is a store's state captured by [State.Capture] for a
// compaction, and written without the store's lock: Write must read only
// what the capture copied, or what no write changes.
type Snapshot struct {
	// Header and End are appended to the snapshot's header and end
	// records; the store puts there what it checks at load (counts, say),
	// and reads them back in [Replayer.SnapshotHeader] and
	// [Replayer.SnapshotEnd].
	Header, End []byte
	// Write writes the records between them.
	Write func(w *SnapshotWriter) error
}

// SnapshotWriter writes the records of a snapshot.
type SnapshotWriter struct {
	w    *bufio.Writer
	size int64
	stop func() error
}

// Write appends a record sealed by [Seal]. It fails once the compaction is
// to stop: the Log is closing, or the context of [Log.Compact] is done.
func (w *SnapshotWriter) Write(rec []byte) error {
	if err := w.stop(); err != nil {
		return err
	}
	n, err := w.w.Write(rec)
	w.size += int64(n)
	return err
}

// writeBackEvery is how many bytes of a snapshot are written before they
// are written back to the device (see writeBack). The smaller the window,
// the less a sync of the live log made meanwhile waits behind it
// (BenchmarkLogSyncDuringSnapshot compares 1 MB with the former 8 MB), for
// a snapshot written some 10-15% slower.
const writeBackEvery = 1 << 20

// pacedFile writes a snapshot to f, writing each writeBackEvery bytes back
// to the device as it goes: the snapshot's writer waits for its own
// writes, instead of leaving hundreds of megabytes for the final fsync and
// for every fsync of the live log made meanwhile.
type pacedFile struct {
	f             *os.File
	written, done int64 // bytes written; bytes written back
	off           bool  // the file system does not take the write-back
	every         int64 // the write-back window; writeBackEvery when zero
	// writeBack is the write-back: writeBack, or a test's.
	writeBack func(f *os.File, off, n int64) error
}

// errWriteBackUnsupported is a file (system) that does not take the
// write-back.
var errWriteBackUnsupported = errors.New("wal: write-back not supported here")

// Write writes b. The write-back is an optimisation (the final fsync makes
// the snapshot durable), so a file system that does not support it just
// stops being asked; but a write error it reports fails the snapshot,
// since the final fsync would not report it again.
func (p *pacedFile) Write(b []byte) (int, error) {
	n, err := p.f.Write(b)
	p.written += int64(n)
	every := p.every
	if every == 0 {
		every = writeBackEvery
	}
	if err == nil && !p.off && p.written-p.done >= every {
		switch werr := p.writeBack(p.f, p.done, p.written-p.done); {
		case errors.Is(werr, errWriteBackUnsupported):
			p.off = true
		case werr != nil:
			return n, werr
		}
		p.done = p.written
	}
	return n, err
}

// Compact writes the store's state to a new snapshot and removes the logs
// it covers. It runs in the background on its own when the log has grown
// (see [Options.CompactBytes]); writes go on while it runs, except while
// it starts the next log and captures the state.
func (l *Log) Compact(ctx context.Context) error {
	l.mu.Lock()
	if l.closing.Load() {
		l.mu.Unlock()
		return ErrClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	return l.compact(ctx)
}

// maybeCompactLocked starts a background compaction when the log has grown
// enough; mu is held.
func (l *Log) maybeCompactLocked() {
	if l.compacting || l.closing.Load() || l.opts.CompactBytes < 0 || l.logBytes < l.nextCompact {
		return
	}
	l.compacting = true
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := l.compact(context.Background())
		l.mu.Lock()
		l.compacting = false
		l.mu.Unlock()
		if err != nil && !errors.Is(err, ErrClosed) {
			l.logger.Error("wal: compaction failed; the log keeps growing until one succeeds", "err", err)
		}
	}()
}

// compact is the compaction: under the locks, sync the log, start the next
// one and capture the state; then, without them, write the snapshot to a
// temporary file, sync it and rename it into place; then remove the logs it
// covers. A crash before the rename leaves the old snapshot and every log;
// after it, the new snapshot and possibly logs it covers, which Open
// removes.
func (l *Log) compact(ctx context.Context) error {
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	began := time.Now()
	snap, next, covered, err := l.rotateAndCapture()
	if err != nil {
		return err
	}
	size, err := l.writeSnapshot(next, snap, func() error { return l.stopped(ctx) })
	if err != nil {
		l.mu.Lock()
		if l.opts.CompactBytes > 0 {
			l.nextCompact = l.logBytes + l.opts.CompactBytes
		}
		l.mu.Unlock()
		return err
	}
	var errs []error
	seqs, err := ListLogs(l.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, seq := range seqs {
		if seq < next {
			if err := os.Remove(filepath.Join(l.dir, LogName(seq))); err != nil {
				errs = append(errs, fmt.Errorf("wal: remove compacted log: %w", err))
			}
		}
	}
	l.mu.Lock()
	l.logBytes -= covered
	l.nextCompact = max(l.opts.CompactBytes, size)
	l.mu.Unlock()
	l.logger.Info("wal: compacted", "snapshot_bytes", size, "log_bytes_covered", covered, "took", time.Since(began).Round(time.Millisecond))
	return errors.Join(errs...)
}

// rotateAndCapture starts the next log and captures the state the snapshot
// will hold: everything in the logs before the new one.
func (l *Log) rotateAndCapture() (snap Snapshot, next uint64, covered int64, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.state.Lock()
	defer l.state.Unlock()
	next, covered, err = l.rotateLocked()
	if err != nil {
		return Snapshot{}, 0, 0, err
	}
	snap, err = l.state.Capture()
	if err != nil {
		return Snapshot{}, 0, 0, fmt.Errorf("wal: capture the state: %w", err)
	}
	return snap, next, covered, nil
}

// writeSnapshot writes snap, covering the logs before next, to a temporary
// file and renames it into place, syncing the file and the directory.
func (l *Log) writeSnapshot(next uint64, snap Snapshot, stop func() error) (size int64, err error) {
	tmp := filepath.Join(l.dir, TempSnapshotName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("wal: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			err = fmt.Errorf("wal: write snapshot: %w", err)
		}
	}()
	w := &SnapshotWriter{w: bufio.NewWriterSize(&pacedFile{f: f, writeBack: writeBack}, 1<<20), stop: stop}
	head := l.format.appendHeader(NewRecord(32+len(l.format.Magic)+len(snap.Header)), KindSnapshotHeader, next)
	rec, err := Seal(append(head, snap.Header...))
	if err != nil {
		return 0, err
	}
	if err := w.Write(rec); err != nil {
		return 0, err
	}
	if snap.Write != nil {
		if err := snap.Write(w); err != nil {
			return 0, err
		}
	}
	rec, err = Seal(append(append(NewRecord(1+len(snap.End)), KindSnapshotEnd), snap.End...))
	if err != nil {
		return 0, err
	}
	if err := w.Write(rec); err != nil {
		return 0, err
	}
	if err := w.w.Flush(); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("wal: write snapshot: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(l.dir, SnapshotName)); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("wal: write snapshot: %w", err)
	}
	if err := atomicfile.SyncDir(l.dir); err != nil {
		return 0, fmt.Errorf("wal: sync %s after renaming the snapshot: %w", l.dir, err)
	}
	return w.size, nil
}

// readSnapshot loads a snapshot through r and returns the first log it
// does not cover. A snapshot is renamed into place only when complete, so
// any defect in it, a short one included, is corruption.
func (l *Log) readSnapshot(f *os.File, path string, r Replayer) (uint64, error) {
	rr, err := NewReader(f, path)
	if err != nil {
		return 0, err
	}
	var next uint64
	for i := 0; ; i++ {
		off := rr.Offset()
		payload, err := rr.Next()
		if errors.Is(err, io.EOF) {
			return 0, &CorruptError{Path: path, Offset: off, Reason: "the snapshot has no end record"}
		}
		if errors.Is(err, ErrTorn) {
			return 0, rr.Corrupt("the snapshot ends inside a record")
		}
		if err != nil {
			return 0, err
		}
		corrupt := func(err error) error { return &CorruptError{Path: path, Offset: off, Reason: err.Error()} }
		switch {
		case i == 0:
			d := NewDecoder(payload)
			if d.Byte() != KindSnapshotHeader {
				return 0, corrupt(errors.New("the snapshot does not start with its header"))
			}
			next = l.format.readHeader(d)
			if d.Err() != nil {
				return 0, corrupt(d.Err())
			}
			if err := r.SnapshotHeader(d.Fixed(d.Remaining())); err != nil {
				return 0, corrupt(err)
			}
		case payload[0] == KindSnapshotEnd:
			if err := r.SnapshotEnd(payload[1:]); err != nil {
				return 0, corrupt(err)
			}
			if rr.Offset() != rr.Size() {
				return 0, &CorruptError{Path: path, Offset: rr.Offset(), Reason: "bytes after the end record"}
			}
			return next, nil
		default:
			if err := r.SnapshotRecord(payload); err != nil {
				return 0, corrupt(err)
			}
		}
	}
}
