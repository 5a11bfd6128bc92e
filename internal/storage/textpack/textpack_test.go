package textpack

import (
	"testing"
	"unsafe"
)

func TestPackedStringsShareOneText(t *testing.T) {
	in := []string{"key", "", "a title ü", "hash", "x"}
	vars := make([]string, len(in))
	ptrs := make([]*string, len(in))
	for i := range in {
		vars[i] = string([]byte(in[i])) // a copy of its own
		ptrs[i] = &vars[i]
	}
	Pack(ptrs)
	first := unsafe.StringData(vars[0])
	offset := 0
	for i, s := range in {
		if vars[i] != s {
			t.Errorf("string %d: %q, want %q", i, vars[i], s)
		}
		if len(s) > 0 && unsafe.StringData(vars[i]) != (*byte)(unsafe.Add(unsafe.Pointer(first), offset)) {
			t.Errorf("string %d does not lie in the packed text", i)
		}
		offset += len(s)
	}
	if n := testing.AllocsPerRun(10, func() { Pack(ptrs) }); n > 1 {
		t.Errorf("packing took %v allocations, want the text alone", n)
	}
}
