package waltest

import (
	"math"
	"runtime"
	"runtime/metrics"
	"time"
)

// GCCost is what a store's content costs the garbage collector.
type GCCost struct {
	// ObjectsPerItem is the number of live heap objects per item held.
	ObjectsPerItem float64
	// MarkCPU is the CPU time one full collection spent marking.
	MarkCPU time.Duration
}

var markClasses = []string{
	"/cpu/classes/gc/mark/assist:cpu-seconds",
	"/cpu/classes/gc/mark/dedicated:cpu-seconds",
	"/cpu/classes/gc/mark/idle:cpu-seconds",
}

// HeapObjects collects garbage and returns the number of live heap
// objects.
func HeapObjects() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/objects:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// MeasureGC returns the live objects beyond before (a HeapObjects taken
// before the items were loaded) per item, and the least mark CPU of five
// full collections: a collection's mark work is that of the live heap, and
// the least of several leaves out what other work of the process added to
// one.
func MeasureGC(before uint64, items int) GCCost {
	objects := HeapObjects() - before
	s := make([]metrics.Sample, len(markClasses))
	for i, name := range markClasses {
		s[i].Name = name
	}
	read := func() (total float64) {
		metrics.Read(s)
		for _, v := range s {
			total += v.Value.Float64()
		}
		return total
	}
	least := math.Inf(1)
	for range 5 {
		from := read()
		runtime.GC()
		least = min(least, read()-from)
	}
	return GCCost{ObjectsPerItem: float64(objects) / float64(items), MarkCPU: time.Duration(least * float64(time.Second))}
}
