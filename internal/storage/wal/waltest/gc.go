package waltest

import (
	"runtime"
	"runtime/metrics"
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
