//go:build linux

package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkLogSyncDuringSnapshot measures what a compaction's snapshot
// write costs the live log: how long the log's syncs take while a
// snapshot is written through pacedFile, for a write-back window of 8 MB
// and for writeBackEvery, alternating in one run on the same file system.
// A projector acknowledges a batch only after its log is synced, so a
// slow sync here is commit -> applied latency there.
func BenchmarkLogSyncDuringSnapshot(b *testing.B) {
	windows := []int64{8 << 20, writeBackEvery}
	if windows[0] == windows[1] {
		b.Fatal("writeBackEvery is the window it is compared with")
	}
	dir := b.TempDir()
	syncs := make([][]time.Duration, len(windows))
	snapshots := make([]time.Duration, len(windows))
	runs := 0
	for b.Loop() {
		// Each window goes first in every other iteration.
		for j := range windows {
			i := (j + runs) % len(windows)
			s, took := syncsDuringSnapshot(b, dir, windows[i])
			syncs[i] = append(syncs[i], s...)
			snapshots[i] += took
		}
		runs++
	}
	over := make([]float64, len(windows))
	p99 := make([]time.Duration, len(windows))
	for i, w := range windows {
		s := syncs[i]
		slices.Sort(s)
		n := 0
		for _, d := range s {
			if d > 20*time.Millisecond {
				n++
			}
		}
		over[i] = 100 * float64(n) / float64(len(s))
		p99[i] = s[len(s)*99/100]
		name := fmt.Sprintf("%dMB", w>>20)
		b.ReportMetric(over[i], name+"_syncs_over_20ms_%")
		b.ReportMetric(float64(p99[i].Microseconds())/1000, name+"_sync_p99_ms")
		b.Logf("window %s: %d log syncs during %d snapshots of %d MB (%v each on average): p50 %v, p99 %v, max %v, %.1f%% over 20 ms",
			name, len(s), runs, benchSnapshotBytes>>20, (snapshots[i] / time.Duration(runs)).Round(time.Millisecond),
			s[len(s)/2].Round(time.Microsecond), p99[i].Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond), over[i])
	}
	overRatio := "none over 20 ms with the smaller window"
	if over[1] > 0 {
		overRatio = fmt.Sprintf("%.2fx", over[0]/over[1])
	}
	b.Logf("8 MB / %d MB window: syncs over 20 ms %s; sync p99 %.2fx; snapshot time %.2fx",
		writeBackEvery>>20, overRatio, float64(p99[0])/float64(p99[1]), float64(snapshots[0])/float64(snapshots[1]))
}

const (
	benchSnapshotBytes = 128 << 20
	benchLogRecord     = 64 << 10
	benchLogEvery      = 5 * time.Millisecond
)

// syncsDuringSnapshot writes a snapshot of benchSnapshotBytes through a
// pacedFile with window w, and syncs it, while a log in the same directory
// appends a record and syncs every benchLogEvery. It returns the log's
// sync times and how long the snapshot took.
func syncsDuringSnapshot(b *testing.B, dir string, w int64) ([]time.Duration, time.Duration) {
	b.Helper()
	snap, err := os.Create(filepath.Join(dir, TempSnapshotName))
	if err != nil {
		b.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, LogName(1)))
	if err != nil {
		b.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		took    time.Duration
		snapErr error
		done    = make(chan struct{})
	)
	wg.Go(func() {
		defer close(done)
		began := time.Now()
		p := &pacedFile{f: snap, writeBack: writeBack, every: w}
		chunk := make([]byte, 1<<20) // the snapshot writer's buffer size
		for i := range chunk {
			chunk[i] = byte(i * 7)
		}
		for range benchSnapshotBytes / len(chunk) {
			if _, snapErr = p.Write(chunk); snapErr != nil {
				return
			}
		}
		snapErr = snap.Sync()
		took = time.Since(began)
	})
	rec := make([]byte, benchLogRecord)
	var syncs []time.Duration
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(benchLogEvery):
		}
		if _, err := log.Write(rec); err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		if err := log.Sync(); err != nil {
			b.Fatal(err)
		}
		syncs = append(syncs, time.Since(began))
	}
	wg.Wait()
	if snapErr != nil {
		b.Fatal(snapErr)
	}
	for _, f := range []*os.File{snap, log} {
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		if err := os.Remove(f.Name()); err != nil {
			b.Fatal(err)
		}
	}
	return syncs, took
}
