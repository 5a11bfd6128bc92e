package embedded

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/converge-sync/converge/internal/index"
)

// Records of a snapshot hold this many points or markers each.
const (
	snapshotPointBatch  = 256
	snapshotMarkerBatch = 4096
)

// snapshotState is the content of a snapshot, captured under the lock.
type snapshotState struct {
	nextSeq uint64 // the first log the snapshot does not cover
	dim     int
	points  []*index.Point
	markers []index.Marker
}

// Compact writes the store's content to a new snapshot and removes the logs
// it covers. It runs in the background on its own when the log has grown
// (see [Options.CompactBytes]); writes go on while it runs.
func (s *Store) Compact(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return s.compact(ctx)
}

// maybeCompactLocked starts a background compaction when the log has grown
// enough; mu is held.
func (s *Store) maybeCompactLocked() {
	if s.compacting || s.closing || s.opts.CompactBytes < 0 || s.logBytes < s.nextCompact {
		return
	}
	s.compacting = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.compact(context.Background())
		s.mu.Lock()
		s.compacting = false
		s.mu.Unlock()
		if err != nil && !errors.Is(err, ErrClosed) {
			s.logger.Error("embedded index: compaction failed; the log keeps growing until one succeeds", "err", err)
		}
	}()
}

// compact is the compaction: under the locks, sync the log, start the next
// one and capture the state; then, without them, write the snapshot to a
// temporary file, sync it and rename it into place; then remove the logs it
// covers. A crash before the rename leaves the old snapshot and every log;
// after it, the new snapshot and possibly logs it covers, which Open
// removes.
func (s *Store) compact(ctx context.Context) error {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	snap, covered, err := s.rotate()
	if err != nil {
		return err
	}
	stop := func() error {
		select {
		case <-s.done:
			return ErrClosed
		default:
			return ctx.Err()
		}
	}
	size, err := writeSnapshot(s.dir, snap, stop)
	if err != nil {
		s.mu.Lock()
		if s.opts.CompactBytes > 0 {
			s.nextCompact = s.logBytes + s.opts.CompactBytes
		}
		s.mu.Unlock()
		return err
	}
	var errs []error
	seqs, err := listLogs(s.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, seq := range seqs {
		if seq < snap.nextSeq {
			if err := os.Remove(filepath.Join(s.dir, logName(seq))); err != nil {
				errs = append(errs, fmt.Errorf("embedded index: remove compacted log: %w", err))
			}
		}
	}
	s.mu.Lock()
	s.logBytes -= covered
	s.nextCompact = max(s.opts.CompactBytes, size)
	s.mu.Unlock()
	return errors.Join(errs...)
}

// rotate syncs and closes the current log, starts the next and captures
// the state the snapshot will hold: everything in the logs before the new
// one. It returns the bytes of log the snapshot will cover.
func (s *Store) rotate() (snapshotState, int64, error) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return snapshotState{}, 0, err
	}
	if err := s.logFile.Sync(); err != nil {
		s.failed = fmt.Errorf("embedded index: sync %s: %w", s.logFile.Name(), err)
		return snapshotState{}, 0, s.failed
	}
	s.synced = s.written
	next := s.logSeq + 1
	f, n, err := createLog(s.dir, next)
	if err != nil {
		return snapshotState{}, 0, err
	}
	covered := s.logBytes
	if err := s.logFile.Close(); err != nil {
		// Already synced: nothing is lost.
		s.logger.Warn("embedded index: close rotated log", "err", err)
	}
	s.logFile, s.logSeq, s.logSize = f, next, n
	s.logBytes += n
	s.written += n
	s.synced = s.written
	snap := snapshotState{
		nextSeq: next,
		dim:     s.dim,
		points:  slices.Clone(s.all),
		markers: make([]index.Marker, 0, len(s.markers)),
	}
	for _, m := range s.markers {
		snap.markers = append(snap.markers, m)
	}
	return snap, covered, nil
}

// writeSnapshot writes snap to a temporary file and renames it into place,
// syncing the file and the directory; stop is polled between records.
func writeSnapshot(dir string, snap snapshotState, stop func() error) (size int64, err error) {
	tmp := filepath.Join(dir, snapshotTmpName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("embedded index: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			err = fmt.Errorf("embedded index: write snapshot: %w", err)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	put := func(rec []byte, err error) error {
		if err != nil {
			return err
		}
		_, err = w.Write(rec)
		size += int64(len(rec))
		return err
	}
	if err := put(encodeSnapshotHeader(snap.nextSeq, snap.dim, len(snap.points), len(snap.markers))); err != nil {
		return 0, err
	}
	for batch := range slices.Chunk(snap.markers, snapshotMarkerBatch) {
		if err := stop(); err != nil {
			return 0, err
		}
		if err := put(encodeMarkers(batch)); err != nil {
			return 0, err
		}
	}
	for batch := range slices.Chunk(snap.points, snapshotPointBatch) {
		if err := stop(); err != nil {
			return 0, err
		}
		if err := put(encodeUpsert(batch)); err != nil {
			return 0, err
		}
	}
	if err := put(encodeSnapshotEnd(len(snap.points), len(snap.markers))); err != nil {
		return 0, err
	}
	if err := w.Flush(); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("embedded index: write snapshot: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, snapshotName)); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("embedded index: write snapshot: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return 0, fmt.Errorf("embedded index: sync %s after renaming the snapshot: %w", dir, err)
	}
	return size, nil
}

// readSnapshot loads a snapshot and returns the first log it does not
// cover. A snapshot is renamed into place only when complete, so any defect
// in it, a short one included, is corruption.
func (s *Store) readSnapshot(f *os.File, path string) (uint64, error) {
	rr, err := newRecordReader(f, path)
	if err != nil {
		return 0, err
	}
	var head record
	var points, markers uint64
	for i := 0; ; i++ {
		off := rr.off
		payload, err := rr.next()
		if errors.Is(err, io.EOF) {
			return 0, &CorruptError{Path: path, Offset: off, Reason: "the snapshot has no end record"}
		}
		if errors.Is(err, errTorn) {
			return 0, rr.corrupt("the snapshot ends inside a record")
		}
		if err != nil {
			return 0, err
		}
		rec, err := decodeRecord(payload)
		if err != nil {
			return 0, &CorruptError{Path: path, Offset: off, Reason: err.Error()}
		}
		corrupt := func(reason string) error { return &CorruptError{Path: path, Offset: off, Reason: reason} }
		if i == 0 {
			if rec.op != opSnapshotHeader {
				return 0, corrupt("the snapshot does not start with its header")
			}
			head = rec
			s.dim = rec.dim
			continue
		}
		switch rec.op {
		case opMarkers:
			s.applyMarkers(rec.markers)
			markers += uint64(len(rec.markers))
		case opUpsert:
			for _, p := range rec.points {
				if len(p.Vector) != s.dim {
					return 0, corrupt(fmt.Sprintf("point %s has %d dimensions, the store %d", p.ID, len(p.Vector), s.dim))
				}
			}
			s.applyUpsert(rec.points)
			points += uint64(len(rec.points))
		case opSnapshotEnd:
			if rec.nPoints != head.nPoints || rec.nMarkers != head.nMarkers ||
				points != head.nPoints || markers != head.nMarkers ||
				uint64(len(s.all)) != points || uint64(len(s.markers)) != markers {
				return 0, corrupt(fmt.Sprintf("counts disagree: header %d points %d markers, end %d/%d, read %d/%d, distinct %d/%d",
					head.nPoints, head.nMarkers, rec.nPoints, rec.nMarkers, points, markers, len(s.all), len(s.markers)))
			}
			if rr.off != rr.size {
				return 0, &CorruptError{Path: path, Offset: rr.off, Reason: "bytes after the end record"}
			}
			return head.seq, nil
		default:
			return 0, corrupt(fmt.Sprintf("unexpected op %d in a snapshot", rec.op))
		}
	}
}
