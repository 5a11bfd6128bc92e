package embedded

import (
	"testing"

	"github.com/converge-sync/converge/internal/index"
)

// TestDeleteOps pins what each logged delete removes: a log written before
// opDeleteOlder replays its opDeleteStale records as they were written.
func TestDeleteOps(t *testing.T) {
	for _, c := range []struct {
		op      byte
		keep    int64
		removed []int64 // of versions 1, 2, 3
	}{
		{opDeleteStale, 2, []int64{1, 3}},
		{opDeleteStale, 0, []int64{1, 2, 3}},
		{opDeleteOlder, 2, []int64{1}},
		{opDeleteOlder, 0, []int64{1, 2, 3}},
		{opRetract, 2, []int64{2}},
	} {
		var got []int64
		for v := int64(1); v <= 3; v++ {
			if removes(c.op, index.Keep{Key: "k", Version: c.keep}, &index.Point{Key: "k", Version: v}) {
				got = append(got, v)
			}
		}
		if len(got) != len(c.removed) {
			t.Fatalf("op %d keep %d removes versions %v, want %v", c.op, c.keep, got, c.removed)
		}
		for i := range got {
			if got[i] != c.removed[i] {
				t.Fatalf("op %d keep %d removes versions %v, want %v", c.op, c.keep, got, c.removed)
			}
		}
	}
}
