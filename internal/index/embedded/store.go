package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
)

// Store is the embedded index: an [index.Backend] kept in memory and in an
// append-only log under one directory. See the package documentation for
// the files and the order of writes.
type Store struct {
	dir      string
	opts     Options
	logger   *slog.Logger
	lockFile *os.File
	done     chan struct{} // closed by Close to stop background work
	wg       sync.WaitGroup

	// syncMu serialises syncs of the log with its rotation and with Close.
	// It is always taken before mu.
	syncMu sync.Mutex
	synced int64 // the value of written at the last successful sync

	// compactMu serialises compactions.
	compactMu sync.Mutex

	mu      sync.RWMutex
	closing bool  // Close has begun: no more calls
	closed  bool  // Close has closed the files
	failed  error // a write or sync whose outcome on disk is unknown; sticky
	dim     int
	// Points are never modified once stored (an upsert stores a new one),
	// so a compaction can write a copied slice of them without holding mu.
	all     []*index.Point    // every point once, vectors normalised
	slot    map[uuid.UUID]int // a point's index in all
	byKey   map[string]map[uuid.UUID]*index.Point
	markers map[string]index.Marker

	logFile     *os.File
	logSeq      uint64
	logSize     int64 // bytes in logFile
	logBytes    int64 // bytes in the logs the snapshot does not cover
	written     int64 // bytes appended since Open, over all logs
	nextCompact int64 // logBytes at which a compaction starts
	compacting  bool  // a background compaction is running
}

const (
	lockName        = "LOCK"
	snapshotName    = "snapshot"
	snapshotTmpName = "snapshot.tmp"
	logPrefix       = "wal-"
	logSuffix       = ".log"
)

func logName(seq uint64) string { return fmt.Sprintf("%s%016d%s", logPrefix, seq, logSuffix) }

// Open opens the embedded index in dir, creating the directory if needed,
// and replays its snapshot and logs. It fails with [ErrLocked] if another
// Store has dir open, and with a [*CorruptError] if a file is damaged
// other than by a torn final record, which is truncated away.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded index: %w", err)
	}
	lockFile, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		dir:      dir,
		opts:     opts,
		logger:   opts.Logger.With("index_dir", dir),
		lockFile: lockFile,
		done:     make(chan struct{}),
		slot:     make(map[uuid.UUID]int),
		byKey:    make(map[string]map[uuid.UUID]*index.Point),
		markers:  make(map[string]index.Marker),
	}
	if err := s.load(); err != nil {
		if s.logFile != nil {
			_ = s.logFile.Close()
		}
		_ = unlock(lockFile)
		_ = lockFile.Close()
		return nil, err
	}
	s.synced = s.written
	if opts.SyncEvery > 0 {
		s.wg.Add(1)
		go s.syncLoop()
	}
	return s, nil
}

func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedded index: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("embedded index: lock %s: %w", path, err)
	}
	if !held {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		_ = f.Close()
		if pid := strings.TrimSpace(string(holder)); pid != "" {
			return nil, fmt.Errorf("%w: %s is locked by process %s", ErrLocked, path, pid)
		}
		return nil, fmt.Errorf("%w: %s is locked by another process", ErrLocked, path)
	}
	// The holder's pid is only for the message above.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// load reads the snapshot, then the logs it does not cover, in order.
func (s *Store) load() error {
	tmp := filepath.Join(s.dir, snapshotTmpName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("embedded index: remove unfinished snapshot: %w", err)
	}
	nextSeq := uint64(1)
	snapPath := filepath.Join(s.dir, snapshotName)
	f, err := os.Open(snapPath)
	switch {
	case err == nil:
		nextSeq, err = s.readSnapshot(f, snapPath)
		_ = f.Close()
		if err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("embedded index: %w", err)
	}
	s.nextCompact = max(s.opts.CompactBytes, s.snapshotSize())

	seqs, err := listLogs(s.dir)
	if err != nil {
		return err
	}
	var replay []uint64
	for _, seq := range seqs {
		if seq < nextSeq {
			// Covered by the snapshot: a compaction stopped before removing it.
			if err := os.Remove(filepath.Join(s.dir, logName(seq))); err != nil {
				return fmt.Errorf("embedded index: remove compacted log: %w", err)
			}
			continue
		}
		if want := nextSeq + uint64(len(replay)); seq != want {
			return fmt.Errorf("embedded index: %s: log %s is missing (found %s)", s.dir, logName(want), logName(seq))
		}
		replay = append(replay, seq)
	}
	for i, seq := range replay {
		if err := s.replayLog(seq, i == len(replay)-1); err != nil {
			return err
		}
	}
	if len(replay) == 0 {
		return s.startLog(nextSeq)
	}
	last := replay[len(replay)-1]
	path := filepath.Join(s.dir, logName(last))
	if s.logSize == 0 {
		// Not even the log's header reached the disk: start it again.
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("embedded index: %w", err)
		}
		return s.startLog(last)
	}
	s.logFile, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("embedded index: %w", err)
	}
	s.logSeq = last
	return nil
}

func (s *Store) snapshotSize() int64 {
	fi, err := os.Stat(filepath.Join(s.dir, snapshotName))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// listLogs returns the sequence numbers of the log files in dir, ascending.
func listLogs(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded index: %w", err)
	}
	var seqs []uint64
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), logPrefix)
		if !ok {
			continue
		}
		num, ok = strings.CutSuffix(num, logSuffix)
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(num, 10, 64)
		if err != nil || seq == 0 {
			continue
		}
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	return seqs, nil
}

// replayLog applies one log's records. Only the last log may end in a torn
// record, which is truncated away; every earlier one was synced before the
// next was created.
func (s *Store) replayLog(seq uint64, last bool) error {
	path := filepath.Join(s.dir, logName(seq))
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("embedded index: %w", err)
	}
	defer f.Close()
	rr, err := newRecordReader(f, path)
	if err != nil {
		return err
	}
	header := false
	for {
		off := rr.off
		payload, err := rr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, errTorn) {
			if !last {
				return rr.corrupt("incomplete record in a log that is not the last")
			}
			if err := truncateTail(path, rr.off); err != nil {
				return err
			}
			s.logger.Warn("embedded index: dropped a torn record at the end of the log",
				"path", path, "offset", rr.off, "bytes", rr.size-rr.off)
			break
		}
		if err != nil {
			return err
		}
		rec, err := decodeRecord(payload)
		if err != nil {
			return &CorruptError{Path: path, Offset: off, Reason: err.Error()}
		}
		if !header {
			if rec.op != opLogHeader || rec.seq != seq {
				return &CorruptError{Path: path, Offset: off, Reason: "the log does not start with its own header"}
			}
			header = true
			continue
		}
		if err := s.replay(rec); err != nil {
			return &CorruptError{Path: path, Offset: off, Reason: err.Error()}
		}
	}
	if !header && !last {
		return &CorruptError{Path: path, Offset: 0, Reason: "empty log that is not the last"}
	}
	s.logBytes += rr.off
	s.written += rr.off
	if last {
		s.logSize = rr.off
	}
	return nil
}

func truncateTail(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("embedded index: %w", err)
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("embedded index: truncate torn record: %w", err)
	}
	return nil
}

// replay applies a log record read back at Open.
func (s *Store) replay(rec record) error {
	switch rec.op {
	case opDimension:
		if s.dim != 0 && s.dim != rec.dim {
			return fmt.Errorf("dimension %d recorded after %d", rec.dim, s.dim)
		}
		s.dim = rec.dim
	case opUpsert:
		for _, p := range rec.points {
			if len(p.Vector) != s.dim {
				return fmt.Errorf("point %s has %d dimensions, the store %d", p.ID, len(p.Vector), s.dim)
			}
		}
		s.applyUpsert(rec.points)
	case opDeleteStale:
		s.applyDeleteStale(rec.keeps)
	case opMarkers:
		s.applyMarkers(rec.markers)
	default:
		return fmt.Errorf("unexpected op %d in a log", rec.op)
	}
	return nil
}

// createLog creates log seq with its header record, synced together with
// the directory entry.
func createLog(dir string, seq uint64) (*os.File, int64, error) {
	path := filepath.Join(dir, logName(seq))
	rec, err := encodeLogHeader(seq)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("embedded index: %w", err)
	}
	if _, err = f.Write(rec); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return nil, 0, fmt.Errorf("embedded index: create %s: %w", path, err)
	}
	return f, int64(len(rec)), nil
}

func (s *Store) startLog(seq uint64) error {
	f, n, err := createLog(s.dir, seq)
	if err != nil {
		return err
	}
	s.logFile, s.logSeq, s.logSize = f, seq, n
	s.logBytes += n
	s.written += n
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// The apply functions change the in-memory state; they run with mu held
// (or during Open), after the record is in the log.

func (s *Store) applyUpsert(points []*index.Point) {
	for _, p := range points {
		if i, ok := s.slot[p.ID]; ok {
			old := s.all[i]
			s.all[i] = p
			s.removeFromKey(old)
		} else {
			s.slot[p.ID] = len(s.all)
			s.all = append(s.all, p)
		}
		m := s.byKey[p.Key]
		if m == nil {
			m = make(map[uuid.UUID]*index.Point)
			s.byKey[p.Key] = m
		}
		m[p.ID] = p
	}
}

func (s *Store) removeFromKey(p *index.Point) {
	m := s.byKey[p.Key]
	delete(m, p.ID)
	if len(m) == 0 {
		delete(s.byKey, p.Key)
	}
}

func (s *Store) removePoint(p *index.Point) {
	i := s.slot[p.ID]
	last := len(s.all) - 1
	if i != last {
		moved := s.all[last]
		s.all[i] = moved
		s.slot[moved.ID] = i
	}
	s.all[last] = nil
	s.all = s.all[:last]
	delete(s.slot, p.ID)
	s.removeFromKey(p)
}

// hasStale reports whether k would remove any point.
func (s *Store) hasStale(k index.Keep) bool {
	for _, p := range s.byKey[k.Key] {
		if k.Version == 0 || p.Version != k.Version {
			return true
		}
	}
	return false
}

func (s *Store) applyDeleteStale(keeps []index.Keep) {
	for _, k := range keeps {
		var stale []*index.Point
		for _, p := range s.byKey[k.Key] {
			if k.Version == 0 || p.Version != k.Version {
				stale = append(stale, p)
			}
		}
		for _, p := range stale {
			s.removePoint(p)
		}
	}
}

func (s *Store) applyMarkers(markers []index.Marker) {
	for _, m := range markers {
		if old, ok := s.markers[m.Key]; ok && old.Version >= m.Version {
			continue
		}
		s.markers[m.Key] = m
	}
}

// writable is called with mu held before a write.
func (s *Store) writable() error {
	if s.closing {
		return ErrClosed
	}
	if s.failed != nil {
		return fmt.Errorf("embedded index: an earlier write failed, reopen the store: %w", s.failed)
	}
	return nil
}

// writeLocked appends a sealed record to the log and then applies it in
// memory; mu is held. It returns the log position to sync to.
func (s *Store) writeLocked(rec []byte, apply func()) (int64, error) {
	n, err := s.logFile.Write(rec)
	if err != nil {
		// A partial record followed by later ones would read back as
		// corruption: cut it off, or refuse further writes.
		err = fmt.Errorf("embedded index: append to %s: %w", s.logFile.Name(), err)
		if terr := s.logFile.Truncate(s.logSize); terr != nil {
			s.failed = errors.Join(err, terr)
		}
		return 0, err
	}
	s.logSize += int64(n)
	s.logBytes += int64(n)
	s.written += int64(n)
	apply()
	s.maybeCompactLocked()
	return s.written, nil
}

// commit makes a write durable when every write call is synced.
func (s *Store) commit(end int64) error {
	if s.opts.SyncEvery > 0 {
		return nil
	}
	return s.syncTo(end)
}

// syncTo syncs the log if it has not been synced up to position target.
// Writers that arrive while a sync runs share the next one.
func (s *Store) syncTo(target int64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced >= target {
		return nil
	}
	s.mu.RLock()
	f, written, failed, closed := s.logFile, s.written, s.failed, s.closed
	s.mu.RUnlock()
	if failed != nil {
		return fmt.Errorf("embedded index: log not synced: %w", failed)
	}
	if closed {
		return ErrClosed
	}
	if err := f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty pages:
		// nothing written since the last good sync can be trusted.
		err = fmt.Errorf("embedded index: sync %s: %w", f.Name(), err)
		s.mu.Lock()
		if s.failed == nil {
			s.failed = err
		}
		s.mu.Unlock()
		return err
	}
	s.synced = written
	return nil
}

func (s *Store) syncLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SyncEvery)
	defer t.Stop()
	reported := false
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		s.mu.RLock()
		written := s.written
		s.mu.RUnlock()
		if err := s.syncTo(written); err != nil && !reported && !errors.Is(err, ErrClosed) {
			s.logger.Error("embedded index: background sync failed; writes are refused until the store is reopened", "err", err)
			reported = true
		}
	}
}

// Ensure records the dimension on first use; see [index.Backend].
func (s *Store) Ensure(ctx context.Context, dim int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dim <= 0 {
		return fmt.Errorf("embedded index: dimension %d is not positive", dim)
	}
	s.mu.Lock()
	if err := s.writable(); err != nil {
		s.mu.Unlock()
		return err
	}
	switch s.dim {
	case dim:
		s.mu.Unlock()
		return nil
	case 0:
	default:
		have := s.dim
		s.mu.Unlock()
		return fmt.Errorf("%w: the store holds %d-dimensional vectors, not %d", ErrDimensionMismatch, have, dim)
	}
	rec, err := encodeDimension(dim)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	end, err := s.writeLocked(rec, func() { s.dim = dim })
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.commit(end)
}

// Markers returns the stored markers of keys; see [index.Backend].
func (s *Store) Markers(ctx context.Context, keys []string) (map[string]index.Marker, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closing {
		return nil, ErrClosed
	}
	out := make(map[string]index.Marker, len(keys))
	for _, k := range keys {
		if m, ok := s.markers[k]; ok {
			out[k] = m
		}
	}
	return out, nil
}

// SetMarkers stores markers whose version is greater than the stored one;
// see [index.Backend]. Only the markers that change anything are logged.
func (s *Store) SetMarkers(ctx context.Context, markers []index.Marker) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(markers) == 0 {
		return nil
	}
	s.mu.Lock()
	if err := s.writable(); err != nil {
		s.mu.Unlock()
		return err
	}
	var effective []index.Marker
	pending := make(map[string]int64, len(markers))
	for _, m := range markers {
		cur, ok := pending[m.Key]
		if !ok {
			var stored index.Marker
			stored, ok = s.markers[m.Key]
			cur = stored.Version
		}
		if ok && cur >= m.Version {
			continue
		}
		pending[m.Key] = m.Version
		effective = append(effective, m)
	}
	if len(effective) == 0 {
		s.mu.Unlock()
		return nil
	}
	rec, err := encodeMarkers(effective)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	end, err := s.writeLocked(rec, func() { s.applyMarkers(effective) })
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.commit(end)
}

// Upsert stores points, replacing those with the same ID; see
// [index.Backend]. Vectors are stored normalised, as cosine similarity
// needs only their direction, and are read back normalised.
func (s *Store) Upsert(ctx context.Context, points []index.Point) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(points) == 0 {
		return nil
	}
	// The dimension only ever goes from 0 to its value, so checking it
	// outside the lock is enough; encoding runs outside it too.
	s.mu.RLock()
	dim := s.dim
	s.mu.RUnlock()
	if dim == 0 {
		return ErrNoDimension
	}
	stored := make([]*index.Point, len(points))
	for i := range points {
		p, err := prepare(&points[i], dim)
		if err != nil {
			return err
		}
		stored[i] = p
	}
	rec, err := encodeUpsert(stored)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.writable(); err != nil {
		s.mu.Unlock()
		return err
	}
	end, err := s.writeLocked(rec, func() { s.applyUpsert(stored) })
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.commit(end)
}

// prepare copies p with its vector normalised.
func prepare(p *index.Point, dim int) (*index.Point, error) {
	if len(p.Vector) != dim {
		return nil, fmt.Errorf("%w: point %s has %d dimensions, the store holds %d", ErrDimensionMismatch, p.ID, len(p.Vector), dim)
	}
	cp := *p
	cp.Tags = slices.Clone(p.Tags)
	v, err := normalize(p.Vector)
	if err != nil {
		return nil, fmt.Errorf("embedded index: point %s: %w", p.ID, err)
	}
	cp.Vector = v
	return &cp, nil
}

// normalize returns a unit-length copy of v, or a copy of v if it is zero
// (which then scores 0 against every query).
func normalize(v []float32) ([]float32, error) {
	var sum float64
	for _, f := range v {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, errors.New("vector has a NaN or infinite component")
		}
		sum += float64(f) * float64(f)
	}
	out := make([]float32, len(v))
	if sum == 0 {
		return out, nil
	}
	inv := 1 / math.Sqrt(sum)
	for i, f := range v {
		out[i] = float32(float64(f) * inv)
	}
	return out, nil
}

// DeleteStale removes each key's points of other versions; see
// [index.Backend]. Only the keeps that remove anything are logged.
func (s *Store) DeleteStale(ctx context.Context, keep []index.Keep) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.writable(); err != nil {
		s.mu.Unlock()
		return err
	}
	// Removing points never makes a keep that removes nothing remove
	// something, so judging each against the state before the call is
	// exact.
	var effective []index.Keep
	for _, k := range keep {
		if s.hasStale(k) {
			effective = append(effective, k)
		}
	}
	if len(effective) == 0 {
		s.mu.Unlock()
		return nil
	}
	rec, err := encodeDeleteStale(effective)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	end, err := s.writeLocked(rec, func() { s.applyDeleteStale(effective) })
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.commit(end)
}

// Counts returns each key's number of points; see [index.Backend].
func (s *Store) Counts(ctx context.Context, keys []string) (map[string]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closing {
		return nil, ErrClosed
	}
	out := make(map[string]int, len(keys))
	for _, k := range keys {
		out[k] = len(s.byKey[k])
	}
	return out, nil
}

// Points returns a key's points by version then ordinal; see
// [index.Backend]. Vectors, when asked for, are the stored normalised ones.
func (s *Store) Points(ctx context.Context, key string, withVectors bool) ([]index.Point, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.closing {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	ps := make([]*index.Point, 0, len(s.byKey[key]))
	for _, p := range s.byKey[key] {
		ps = append(ps, p)
	}
	s.mu.RUnlock()
	slices.SortFunc(ps, func(a, b *index.Point) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), cmp.Compare(a.Ordinal, b.Ordinal), compareIDs(a.ID, b.ID))
	})
	out := make([]index.Point, len(ps))
	for i, p := range ps {
		out[i] = copyPoint(p, withVectors)
	}
	return out, nil
}

func copyPoint(p *index.Point, withVector bool) index.Point {
	cp := *p
	cp.Tags = slices.Clone(p.Tags)
	cp.Vector = nil
	if withVector {
		cp.Vector = slices.Clone(p.Vector)
	}
	return cp
}

// ScanMarkers calls fn for every marker; see [index.Backend]. fn runs
// without the store's lock held, on a copy taken at the start.
func (s *Store) ScanMarkers(ctx context.Context, fn func(index.Marker) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	if s.closing {
		s.mu.RUnlock()
		return ErrClosed
	}
	markers := make([]index.Marker, 0, len(s.markers))
	for _, m := range s.markers {
		markers = append(markers, m)
	}
	s.mu.RUnlock()
	for i, m := range markers {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

// Close stops background work, syncs the log and releases the directory.
// It reports a failed sync or write whose outcome on disk is unknown.
// Calls after the first return nil.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()

	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.failed == nil {
		if err := s.logFile.Sync(); err != nil {
			s.failed = fmt.Errorf("embedded index: sync %s: %w", s.logFile.Name(), err)
		} else {
			s.synced = s.written
		}
	}
	if s.failed != nil {
		// Writes acknowledged since the last good sync may be lost.
		errs = append(errs, s.failed)
	}
	if err := s.logFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("embedded index: %w", err))
	}
	if err := unlock(s.lockFile); err != nil {
		errs = append(errs, fmt.Errorf("embedded index: unlock: %w", err))
	}
	if err := s.lockFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("embedded index: %w", err))
	}
	s.closed = true
	return errors.Join(errs...)
}

var _ index.Backend = (*Store)(nil)
