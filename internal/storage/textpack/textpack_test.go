package textpack

import (
	"testing"
	"unsafe"
)

func TestPackedStringsShareOneText(t *testing.T) {
	in := []string{"key", "", "a title ü", "hash", "x"}
	var b Builder
	size := 0
	for _, s := range in {
		size += len(s)
	}
	b.Grow(size)
	spans := make([]Span, len(in))
	for i, s := range in {
		spans[i] = b.Put(s)
	}
	str := b.Text()
	first := unsafe.StringData(str(spans[0]))
	offset := 0
	for i, s := range in {
		got := str(spans[i])
		if got != s {
			t.Errorf("span %d: %q, want %q", i, got, s)
		}
		if len(got) > 0 && unsafe.StringData(got) != (*byte)(unsafe.Add(unsafe.Pointer(first), offset)) {
			t.Errorf("span %d does not lie in the packed text", i)
		}
		offset += len(s)
	}
	if n := testing.AllocsPerRun(10, func() {
		var b Builder
		b.Grow(size)
		for _, s := range in {
			b.Put(s)
		}
		b.Text()
	}); n > 2 {
		t.Errorf("packing took %v allocations, want the text and the accessor at most", n)
	}
}
