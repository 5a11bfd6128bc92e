package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/testenv"
)

var journalFormat = Format{Magic: "converge-test-journal", Version: 3}

const kindEntries byte = 2

// journal is the store of these tests: a list of entries, appended by
// records of a few entries each.
type journal struct {
	sync.Mutex // the state's lock
	entries    []string
	log        *Log

	snapHeader, snapEnd uint64 // the counts its snapshot's records carried at Open
	snapLoaded          int
	// failSnapshot, when set, fails the writing of every snapshot after
	// its first record (under the lock).
	failSnapshot error
}

func encodeEntries(entries []string) []byte {
	b := append(NewRecord(64), kindEntries)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = AppendString(b, e)
	}
	rec, err := Seal(b)
	if err != nil {
		panic(err)
	}
	return rec
}

func decodeEntries(payload []byte) ([]string, error) {
	d := NewDecoder(payload)
	if k := d.Byte(); k != kindEntries {
		return nil, fmt.Errorf("kind %d", k)
	}
	out := make([]string, d.Count(1))
	for i := range out {
		out[i] = d.Str()
	}
	return out, d.Finish()
}

func (j *journal) SnapshotHeader(fields []byte) error {
	d := NewDecoder(fields)
	j.snapHeader = d.Uvarint()
	return d.Finish()
}

func (j *journal) SnapshotRecord(payload []byte) error {
	es, err := decodeEntries(payload)
	j.entries = append(j.entries, es...)
	j.snapLoaded += len(es)
	return err
}

func (j *journal) SnapshotEnd(fields []byte) error {
	d := NewDecoder(fields)
	j.snapEnd = d.Uvarint()
	if j.snapEnd != j.snapHeader || int(j.snapEnd) != j.snapLoaded {
		return fmt.Errorf("header says %d, end %d, loaded %d", j.snapHeader, j.snapEnd, j.snapLoaded)
	}
	return d.Finish()
}

func (j *journal) LogRecord(payload []byte) error {
	es, err := decodeEntries(payload)
	j.entries = append(j.entries, es...)
	return err
}

func (j *journal) Capture() (Snapshot, error) {
	entries := slices.Clone(j.entries)
	fail := j.failSnapshot
	n := binary.AppendUvarint(nil, uint64(len(entries)))
	return Snapshot{Header: n, End: n, Write: func(w *SnapshotWriter) error {
		for batch := range slices.Chunk(entries, 3) {
			if err := w.Write(encodeEntries(batch)); err != nil {
				return err
			}
			if fail != nil {
				return fail
			}
		}
		return nil
	}}, nil
}

func openJournal(t testing.TB, dir string, opts Options) (*journal, error) {
	t.Helper()
	j := &journal{}
	l, err := Open(dir, journalFormat, j, opts)
	if err != nil {
		return nil, err
	}
	j.log = l
	t.Cleanup(func() { _ = l.Close() })
	return j, nil
}

func mustOpen(t testing.TB, dir string, opts Options) *journal {
	t.Helper()
	j, err := openJournal(t, dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return j
}

// add appends one record of entries, applies it and commits it.
func (j *journal) add(entries ...string) error {
	return j.write(entries, true)
}

// write appends one record of entries (none: no record) and applies it,
// and with commit commits everything appended so far.
func (j *journal) write(entries []string, commit bool) error {
	return j.log.Write(j, func() ([]byte, func(), error) {
		if len(entries) == 0 {
			return nil, nil, nil
		}
		return encodeEntries(entries), func() { j.entries = append(j.entries, entries...) }, nil
	}, commit)
}

func (j *journal) mustAdd(t testing.TB, entries ...string) {
	t.Helper()
	if err := j.add(entries...); err != nil {
		t.Fatal(err)
	}
}

func (j *journal) expect(t testing.TB, want ...string) {
	t.Helper()
	j.Lock()
	defer j.Unlock()
	if !slices.Equal(j.entries, want) {
		t.Fatalf("entries %q, want %q", j.entries, want)
	}
}

func noErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func logPath(dir string, seq uint64) string { return filepath.Join(dir, LogName(seq)) }

func sizeOf(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	noErr(t, err)
	return fi.Size()
}

func TestReopenReplaysInOrder(t *testing.T) {
	for _, opts := range []Options{{}, {SyncEvery: 5 * time.Millisecond}} {
		t.Run(fmt.Sprint(opts.SyncEvery), func(t *testing.T) {
			dir := t.TempDir()
			j := mustOpen(t, dir, opts)
			j.mustAdd(t, "a", "b")
			j.mustAdd(t, "c")
			noErr(t, j.log.Close())
			j = mustOpen(t, dir, opts)
			j.expect(t, "a", "b", "c")
			j.mustAdd(t, "d")
			noErr(t, j.log.Close())
			mustOpen(t, dir, opts).expect(t, "a", "b", "c", "d")
		})
	}
}

func TestTornTailTruncated(t *testing.T) {
	dir := t.TempDir()
	j := mustOpen(t, dir, Options{})
	j.mustAdd(t, "kept")
	keep := sizeOf(t, logPath(dir, 1))
	j.mustAdd(t, strings.Repeat("lost ", 20))
	noErr(t, j.log.Close())
	noErr(t, os.Truncate(logPath(dir, 1), sizeOf(t, logPath(dir, 1))-7))

	j = mustOpen(t, dir, Options{})
	j.expect(t, "kept")
	if got := sizeOf(t, logPath(dir, 1)); got != keep {
		t.Fatalf("log is %d bytes after recovery, want %d", got, keep)
	}
	j.mustAdd(t, "after")
	noErr(t, j.log.Close())
	mustOpen(t, dir, Options{}).expect(t, "kept", "after")
}

func TestDamageIsCorruption(t *testing.T) {
	setup := func(t *testing.T) (dir string, second int64) {
		dir = t.TempDir()
		j := mustOpen(t, dir, Options{})
		j.mustAdd(t, "one")
		second = sizeOf(t, logPath(dir, 1))
		j.mustAdd(t, "two")
		j.mustAdd(t, "three")
		noErr(t, j.log.Close())
		return dir, second
	}
	expectCorrupt := func(t *testing.T, dir, path string, off int64, reason string) {
		t.Helper()
		_, err := openJournal(t, dir, Options{})
		var ce *CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want a *CorruptError", err)
		}
		if ce.Path != path || ce.Offset != off || !strings.Contains(ce.Reason, reason) {
			t.Fatalf("got %v, want %s at %d: %s", err, path, off, reason)
		}
	}
	t.Run("flipped payload byte", func(t *testing.T) {
		dir, second := setup(t)
		b, err := os.ReadFile(logPath(dir, 1))
		noErr(t, err)
		b[second+HeaderSize+1] ^= 0x20
		noErr(t, os.WriteFile(logPath(dir, 1), b, 0o600))
		expectCorrupt(t, dir, logPath(dir, 1), second, "payload checksum")
	})
	t.Run("another store's files", func(t *testing.T) {
		dir, _ := setup(t)
		_, err := Open(dir, Format{Magic: "converge-other", Version: 3}, &journal{}, Options{})
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `not a converge-other file (magic "converge-test-journal")`) {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("a record the store rejects", func(t *testing.T) {
		dir, _ := setup(t)
		j := mustOpen(t, dir, Options{})
		j.Lock()
		_, err := j.log.Append(sealed(t, "\x09not entries"))
		j.Unlock()
		noErr(t, err)
		end := sizeOf(t, logPath(dir, 1)) - int64(HeaderSize+len("\x09not entries"))
		noErr(t, j.log.Close())
		expectCorrupt(t, dir, logPath(dir, 1), end, "kind 9")
	})
	// Records spread over three logs, then one of the earlier logs damaged.
	for _, tc := range []struct {
		name   string
		damage func(dir string, second int64) error
		want   func(dir string, second int64) string
	}{
		{"torn record in an earlier log",
			func(dir string, second int64) error { return os.Truncate(logPath(dir, 1), second+3) },
			func(dir string, second int64) string {
				return fmt.Sprintf("%s: corrupt record at offset %d: incomplete record in a log that is not the last", logPath(dir, 1), second)
			}},
		{"missing log",
			func(dir string, _ int64) error { return os.Remove(logPath(dir, 2)) },
			func(string, int64) string { return LogName(2) + " is missing" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, second := setup(t)
			j := mustOpen(t, dir, Options{})
			noErr(t, j.log.Rotate())
			j.mustAdd(t, "four")
			noErr(t, j.log.Rotate())
			noErr(t, j.log.Close())
			noErr(t, tc.damage(dir, second))
			want := tc.want(dir, second)
			if _, err := openJournal(t, dir, Options{}); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Open: %v, want %q", err, want)
			}
		})
	}
}

func TestCompaction(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	j := mustOpen(t, dir, Options{CompactBytes: 1024})
	var want []string
	for i := range 200 {
		e := fmt.Sprint("entry-", i)
		j.mustAdd(t, e)
		want = append(want, e)
	}
	if j.log.Seq() == 1 {
		t.Fatal("no automatic compaction ran")
	}
	noErr(t, j.log.Compact(ctx))
	j.mustAdd(t, "after")
	want = append(want, "after")
	noErr(t, j.log.Close())
	logs, err := ListLogs(dir)
	noErr(t, err)
	if len(logs) != 1 {
		t.Fatalf("logs %v after compaction, want one", logs)
	}
	j = mustOpen(t, dir, Options{})
	j.expect(t, want...)
	if j.snapHeader != 200 || j.snapEnd != 200 || j.snapLoaded != 200 {
		t.Fatalf("snapshot header %d end %d loaded %d, want 200", j.snapHeader, j.snapEnd, j.snapLoaded)
	}
}

// TestCompactionLogged: a compaction reports its snapshot's size and its
// duration to the options' logger.
func TestCompactionLogged(t *testing.T) {
	var logged bytes.Buffer
	j := mustOpen(t, t.TempDir(), Options{CompactBytes: -1, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	j.mustAdd(t, "a", "b")
	noErr(t, j.log.Compact(context.Background()))
	if out := logged.String(); !strings.Contains(out, `msg="wal: compacted" dir=`) || !strings.Contains(out, "snapshot_bytes=") || !strings.Contains(out, "took=") {
		t.Errorf("a compaction logged %q, want its size and duration", out)
	}
}

// TestFailedCompaction: a snapshot that cannot be written leaves the old
// state as it was (the logs it would have covered, no temporary file), is
// reported by Compact and logged when it ran in the background, and the
// store goes on taking writes.
func TestFailedCompaction(t *testing.T) {
	dir := t.TempDir()
	var logged testenv.LockedBuffer
	j := mustOpen(t, dir, Options{CompactBytes: 256, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	j.Lock()
	j.failSnapshot = errors.New("disk on fire")
	j.Unlock()
	var want []string
	for i := range 40 {
		e := fmt.Sprint("entry-", i)
		j.mustAdd(t, e)
		want = append(want, e)
	}
	if err := j.log.Compact(context.Background()); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Compact: %v, want the snapshot's failure", err)
	}
	testenv.Eventually(t, "the failure logged", 10*time.Second, func() bool { return strings.Contains(logged.String(), "wal: compaction failed") })
	if !strings.Contains(logged.String(), "disk on fire") {
		t.Errorf("log %q does not give the reason", logged.String())
	}
	noErr(t, j.log.Close())
	if _, err := os.Stat(filepath.Join(dir, TempSnapshotName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the unfinished snapshot remains: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, SnapshotName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a snapshot was put in place: %v", err)
	}
	j = mustOpen(t, dir, Options{})
	j.expect(t, want...)
}

// TestCompactionLeftovers puts back what a crash during a compaction can
// leave: a log the snapshot covers and an unfinished temporary snapshot.
func TestCompactionLeftovers(t *testing.T) {
	dir := t.TempDir()
	j := mustOpen(t, dir, Options{})
	j.mustAdd(t, "a", "b")
	covered, err := os.ReadFile(logPath(dir, 1))
	noErr(t, err)
	noErr(t, j.log.Compact(context.Background()))
	j.mustAdd(t, "c")
	noErr(t, j.log.Close())
	noErr(t, os.WriteFile(logPath(dir, 1), covered, 0o600))
	noErr(t, os.WriteFile(filepath.Join(dir, TempSnapshotName), []byte("unfinished"), 0o600))

	mustOpen(t, dir, Options{}).expect(t, "a", "b", "c")
	for _, name := range []string{LogName(1), TempSnapshotName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed at Open: %v", name, err)
		}
	}
}

func TestDamagedSnapshot(t *testing.T) {
	setup := func(t *testing.T) (dir, snap string) {
		dir = t.TempDir()
		j := mustOpen(t, dir, Options{})
		j.mustAdd(t, "a", "b", "c", "d")
		noErr(t, j.log.Compact(context.Background()))
		noErr(t, j.log.Close())
		return dir, filepath.Join(dir, SnapshotName)
	}
	endRecord := int64(HeaderSize + 2) // the kind and a one-byte count
	cases := []struct {
		name   string
		damage func(t *testing.T, snap string)
		reason string
	}{
		{"cut short", func(t *testing.T, snap string) { noErr(t, os.Truncate(snap, sizeOf(t, snap)-1)) }, "ends inside a record"},
		{"no end record", func(t *testing.T, snap string) { noErr(t, os.Truncate(snap, sizeOf(t, snap)-endRecord)) }, "no end record"},
		{"bytes after the end", func(t *testing.T, snap string) {
			f, err := os.OpenFile(snap, os.O_WRONLY|os.O_APPEND, 0)
			noErr(t, err)
			_, err = f.Write(sealed(t, "extra"))
			noErr(t, err)
			noErr(t, f.Close())
		}, "bytes after the end record"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, snap := setup(t)
			tc.damage(t, snap)
			_, err := openJournal(t, dir, Options{})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != snap || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("Open: %v, want %q in %s", err, tc.reason, snap)
			}
		})
	}
}

// TestLockDir checks the directory lock: refused while held, naming the
// holder, free again once released, and held by an open Log.
func TestLockDir(t *testing.T) {
	dir := t.TempDir()
	held, err := lockDir(dir)
	noErr(t, err)
	if _, err := lockDir(dir); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "locked by process "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("lock while held: %v", err)
	}
	noErr(t, unlock(held))
	noErr(t, held.Close())
	again, err := lockDir(dir)
	noErr(t, err)
	noErr(t, again.Close()) // closing the file releases the lock too

	j := mustOpen(t, dir, Options{})
	if _, err := openJournal(t, dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("Open while a Log has the directory: %v", err)
	}
	noErr(t, j.log.Close())
	mustOpen(t, dir, Options{})
}

// TestWrite: a change is applied only once its record is appended, a plan
// that fails writes nothing, and a committing write without a record makes
// what earlier writes appended durable.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	j := mustOpen(t, dir, Options{})
	noErr(t, j.write([]string{"a", "b"}, false))
	if j.log.Unsynced() == 0 {
		t.Fatal("a write without commit was synced")
	}
	noErr(t, j.write(nil, true))
	if n := j.log.Unsynced(); n != 0 {
		t.Fatalf("%d bytes unsynced after a committing write", n)
	}
	refused := errors.New("refused")
	err := j.log.Write(j, func() ([]byte, func(), error) {
		return encodeEntries([]string{"never"}), func() { t.Error("a refused change was applied") }, refused
	}, true)
	if !errors.Is(err, refused) || j.log.Unsynced() != 0 {
		t.Fatalf("Write with a failing plan: %v, %d bytes unsynced; want the plan's error and nothing written", err, j.log.Unsynced())
	}
	j.expect(t, "a", "b")
	noErr(t, j.log.Close())
	err = j.log.Write(j, func() ([]byte, func(), error) {
		t.Error("a closed log ran the plan")
		return nil, nil, nil
	}, true)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Write on a closed log: %v, want ErrClosed", err)
	}
	j = mustOpen(t, dir, Options{})
	j.expect(t, "a", "b")
}

func TestClosedLog(t *testing.T) {
	j := mustOpen(t, t.TempDir(), Options{})
	noErr(t, j.log.Close())
	noErr(t, j.log.Close())
	_, err := j.log.Append(encodeEntries([]string{"x"}))
	for i, err := range []error{err, j.log.Compact(context.Background()), j.log.Rotate(), j.log.Writable()} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call %d after Close: %v", i, err)
		}
	}
}

// TestFailedWriteIsSticky makes an append fail in a way whose outcome on
// disk is unknown: every later write is refused, and Close reports it.
func TestFailedWriteIsSticky(t *testing.T) {
	j := mustOpen(t, t.TempDir(), Options{})
	j.mustAdd(t, "a")
	j.log.mu.Lock()
	_ = j.log.file.Close() // the write and the truncation after it both fail
	j.log.mu.Unlock()
	if err := j.add("b"); err == nil {
		t.Fatal("append to a closed file succeeded")
	}
	if err := j.add("c"); err == nil || !strings.Contains(err.Error(), "reopen the store") {
		t.Fatalf("append after a failed one: %v", err)
	}
	if err := j.log.Close(); err == nil {
		t.Fatal("Close did not report the failed write")
	}
}

func TestConcurrentAppendsAndCompactions(t *testing.T) {
	const writers, each = 8, 150
	dir := t.TempDir()
	j := mustOpen(t, dir, Options{CompactBytes: 4096})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := j.add(fmt.Sprintf("%d/%d", w, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	noErr(t, j.log.Close())
	j = mustOpen(t, dir, Options{})
	next := make([]int, writers)
	for _, e := range j.entries {
		var w, i int
		if _, err := fmt.Sscanf(e, "%d/%d", &w, &i); err != nil || i != next[w] {
			t.Fatalf("entry %q out of order (next of writer %d is %d)", e, w, next[w])
		}
		next[w]++
	}
	if len(j.entries) != writers*each {
		t.Fatalf("%d entries, want %d", len(j.entries), writers*each)
	}
}

// A snapshot larger than writeBackEvery is written back as it goes, and
// arrives whole.
func TestPacedFileWritesEverything(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "snapshot.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The write-back's ranges are recorded and passed on to the real one
	// where it exists: together they cover what was written, in order.
	var ranges [][2]int64
	p := &pacedFile{f: f, writeBack: func(f *os.File, off, n int64) error {
		ranges = append(ranges, [2]int64{off, n})
		if err := writeBack(f, off, n); err != nil && !errors.Is(err, errWriteBackUnsupported) {
			return err
		}
		return nil
	}}
	r := rand.New(rand.NewPCG(3, 4))
	var want []byte
	for len(want) < 3*writeBackEvery+12345 {
		chunk := make([]byte, 1+r.IntN(writeBackEvery/4))
		for i := range chunk {
			chunk[i] = byte(r.Uint32())
		}
		if n, err := p.Write(chunk); err != nil || n != len(chunk) {
			t.Fatalf("write: %d of %d, %v", n, len(chunk), err)
		}
		want = append(want, chunk...)
	}
	var next int64
	for _, r := range ranges {
		if r[0] != next || r[1] < writeBackEvery {
			t.Fatalf("write-back ranges %v: want contiguous ranges of at least %d bytes from 0", ranges, writeBackEvery)
		}
		next += r[1]
	}
	// Everything is written back but what is short of a window.
	if next <= p.written-writeBackEvery || next < 2*writeBackEvery || p.written != int64(len(want)) {
		t.Fatalf("written %d (want %d), written back %d: want all but less than %d written back", p.written, len(want), next, writeBackEvery)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the file holds %d bytes, not the %d written", len(got), len(want))
	}
}

// A file the write-back does not apply to (here a character device) still
// takes the whole snapshot: the write-back stops being asked, and no write
// fails for it.
func TestPacedFileWithoutWriteBack(t *testing.T) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	p := &pacedFile{f: f, writeBack: writeBack}
	chunk := make([]byte, 1<<20)
	for range 3 * writeBackEvery / len(chunk) {
		if n, err := p.Write(chunk); err != nil || n != len(chunk) {
			t.Fatalf("write: %d of %d, %v", n, len(chunk), err)
		}
	}
	if runtime.GOOS == "linux" && !p.off {
		t.Fatal("sync_file_range on a character device did not fail: this test checks nothing here")
	}
}

// A write error the write-back reports (EIO, ENOSPC) fails the snapshot:
// the final fsync would not report it again.
func TestPacedFileWriteBackErrorFailsTheWrite(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "snapshot.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	eio := errors.New("input/output error")
	p := &pacedFile{f: f, writeBack: func(*os.File, int64, int64) error { return eio }}
	chunk := make([]byte, writeBackEvery/4)
	for range writeBackEvery/len(chunk) - 1 {
		if _, err := p.Write(chunk); err != nil {
			t.Fatalf("a write before the first write-back failed: %v", err)
		}
	}
	if _, err := p.Write(chunk); !errors.Is(err, eio) {
		t.Fatalf("the write that triggers a failing write-back: err %v, want %v", err, eio)
	}
}
