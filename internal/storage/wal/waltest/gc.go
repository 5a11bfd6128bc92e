package waltest

import (
	"io"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/storage/wal"
)

// GCCost is what a store's content costs the garbage collector, per item
// held: the objects it marks, and the bytes it scans for pointers, in
// every collection while the items live.
type GCCost struct {
	ObjectsPerItem   float64
	ScanBytesPerItem float64
}

// Heap is the live heap as the last collection left it.
type Heap struct {
	Objects   uint64 // live objects
	ScanBytes uint64 // bytes of them that may hold pointers
}

// LiveHeap collects garbage and returns the live heap.
func LiveHeap() Heap {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/objects:objects"}, {Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	return Heap{Objects: s[0].Value.Uint64(), ScanBytes: s[1].Value.Uint64()}
}

// MeasureGC returns what the heap live now holds beyond before (a
// LiveHeap taken before the items were loaded), per item. Both figures
// are exact, unlike a collection's duration, which varies from run to
// run with everything else the machine does.
func MeasureGC(before Heap, items int) GCCost {
	now := LiveHeap()
	return GCCost{
		ObjectsPerItem:   float64(int64(now.Objects)-int64(before.Objects)) / float64(items),
		ScanBytesPerItem: float64(int64(now.ScanBytes)-int64(before.ScanBytes)) / float64(items),
	}
}

// BenchmarkHeld compares what items cost the garbage collector held as
// decoded and held in a store, in the sub-benchmarks "decoded" and
// "store" of one run. For "store" it opens a store with open in a fresh
// directory (no background sync or compaction) and closes it after the
// measurement; load adds the items to s with inStore, and otherwise
// returns them as decoded. unit names an item in the metrics:
// objects/<unit>, scan_bytes/<unit>.
func BenchmarkHeld[S io.Closer](b *testing.B, unit string, items int, open func(string, wal.Options) (S, error),
	load func(b *testing.B, s S, inStore bool) (held any)) {
	results := map[string]GCCost{}
	for _, layout := range []string{"decoded", "store"} {
		b.Run(layout, func(b *testing.B) {
			var cost GCCost
			for b.Loop() {
				before := LiveHeap()
				var s S
				if layout == "store" {
					// Not Open: its cleanup would keep every iteration's
					// store alive until the benchmark ends.
					var err error
					if s, err = open(b.TempDir(), wal.Options{SyncEvery: time.Hour, CompactBytes: -1}); err != nil {
						b.Fatal(err)
					}
				}
				held := load(b, s, layout == "store")
				cost = MeasureGC(before, items)
				runtime.KeepAlive(held)
				if layout == "store" {
					if err := s.Close(); err != nil {
						b.Fatal(err)
					}
				}
			}
			results[layout] = cost
			if d, found := results["decoded"]; found && layout == "store" {
				b.Logf("%d %ss held: as decoded %.1f objects and %.0f scanned bytes a %s; in the store %.1f and %.0f (store/decoded: objects %.2f, scanned bytes %.2f)",
					items, unit, d.ObjectsPerItem, d.ScanBytesPerItem, unit, cost.ObjectsPerItem, cost.ScanBytesPerItem,
					cost.ObjectsPerItem/d.ObjectsPerItem, cost.ScanBytesPerItem/d.ScanBytesPerItem)
			}
			b.ReportMetric(cost.ObjectsPerItem, "objects/"+unit)
			b.ReportMetric(cost.ScanBytesPerItem, "scan_bytes/"+unit)
		})
	}
}
