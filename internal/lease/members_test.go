package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/testenv"
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

// A member's claim has every partition go to it, on every member, while
// it is live: the smaller id of two claimers wins, an ended claim gives
// the partitions back to the assignment, and so does a claimer that
// leaves.
func TestClaimTakesEveryPartition(t *testing.T) {
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	parts := []string{"x.p00", "x.p01", "x.p02", "x.p03"}
	ctx := context.Background()
	open := func(holder string) (*lease.Members, context.CancelFunc) {
		m, err := lease.OpenMembers(ctx, js, "x", holder, parts, 600*time.Millisecond, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return m, func() { cancel(); <-done }
	}
	a, _ := open("a")
	b, stopB := open("b")
	held := func(m *lease.Members) int {
		n := 0
		for _, p := range parts {
			if m.Wants(p) {
				n++
			}
		}
		return n
	}
	split := func(what string, wantA, wantB int) {
		t.Helper()
		testenv.Eventually(t, what, 10*time.Second, func() bool { return held(a) == wantA && held(b) == wantB })
	}
	split("a and b share the partitions", 2, 2)
	a.Claim(ctx, true)
	split("every partition goes to a, which claims them", 4, 0)
	b.Claim(ctx, true)
	first, second := a, b
	if b.ID() < a.ID() {
		first, second = b, a
	}
	testenv.Eventually(t, "the claimer of the smaller id to win on both", 10*time.Second, func() bool {
		return held(first) == 4 && held(second) == 0 && a.Claimer() == first.ID() && b.Claimer() == first.ID()
	})
	a.Claim(ctx, false)
	split("every partition goes to b, the one claimer left", 0, 4)
	stopB()
	testenv.Eventually(t, "a to hold every partition once the claimer left", 10*time.Second, func() bool {
		return held(a) == 4 && a.Claimer() == ""
	})
}
