package lease_test

import (
	"fmt"
	"testing"

	"github.com/converge-sync/converge/internal/lease"
)

// The assignment gives every partition to one live member, each member
// its share or one more, the same from one call to the next; it logs how
// many partitions move when a member joins.
func TestAssignIsBalancedAndStable(t *testing.T) {
	for _, n := range []int{2, 4, 8, 16} {
		var parts []string
		for p := range n {
			parts = append(parts, fmt.Sprintf("index.p%02d", p))
		}
		var live []string
		var before map[string]string
		for m := range 6 {
			live = append(live, lease.MemberID(fmt.Sprintf("host-%d/127.0.0.1:%d", m, 9000+m)))
			got := lease.Assign(live, parts)
			if len(got) != n {
				t.Fatalf("%d partitions, %d members: %d assigned", n, len(live), len(got))
			}
			held := map[string]int{}
			for _, id := range got {
				held[id]++
			}
			share := (n + len(live) - 1) / len(live)
			least := n / len(live)
			for _, id := range live {
				if held[id] > share || (n >= len(live) && held[id] < least) {
					t.Errorf("%d partitions, %d members: member %s holds %d, the share is %d-%d: %v", n, len(live), id, held[id], least, share, held)
				}
			}
			if again := lease.Assign(append([]string{}, live...), parts); fmt.Sprint(again) != fmt.Sprint(got) {
				t.Errorf("the assignment differs from one call to the next")
			}
			if before != nil {
				moved := 0
				for part, id := range got {
					if before[part] != id && id != live[len(live)-1] {
						moved++
					}
				}
				t.Logf("%d partitions, %d -> %d members: %d moved to the new member, %d between the others", n, len(live)-1, len(live), held[live[len(live)-1]], moved)
			}
			before = got
		}
	}
}
