package wal

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/converge-sync/converge/internal/storage/atomicfile"
)

// The files of a directory.
const (
	LockName         = "LOCK"         // flock'd by the one process that has the directory open
	SnapshotName     = "snapshot"     // the state as of some log
	TempSnapshotName = "snapshot.tmp" // a snapshot being written
	logPrefix        = "wal-"
	logSuffix        = ".log"
)

// LogName is the file name of log seq.
func LogName(seq uint64) string { return fmt.Sprintf("%s%016d%s", logPrefix, seq, logSuffix) }

// ListLogs returns the sequence numbers of the log files in dir, ascending.
func ListLogs(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
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

// lockDir takes the directory's lock file, or fails with ErrLocked naming
// the process that holds it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("wal: lock %s: %w", path, err)
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

// createLog creates log seq with its header record, synced together with
// the directory entry.
func createLog(dir string, f Format, seq uint64) (*os.File, int64, error) {
	path := filepath.Join(dir, LogName(seq))
	rec, err := Seal(f.appendHeader(NewRecord(32+len(f.Magic)), KindLogHeader, seq))
	if err != nil {
		return nil, 0, err
	}
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("wal: %w", err)
	}
	if _, err = file.Write(rec); err == nil {
		err = file.Sync()
	}
	if err == nil {
		err = atomicfile.SyncDir(dir)
	}
	if err != nil {
		_ = file.Close()
		_ = os.Remove(path)
		return nil, 0, fmt.Errorf("wal: create %s: %w", path, err)
	}
	return file, int64(len(rec)), nil
}

func truncateTail(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: truncate torn record: %w", err)
	}
	return nil
}
