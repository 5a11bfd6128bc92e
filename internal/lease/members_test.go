package lease_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/testenv"
)

// The assignment gives every partition to one live member, each member
// its share or one more, the same from one call to the next; a member
// joining moves at most half the partitions between the others.
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
				// A joining member moves few partitions besides those it
				// takes: a modulo of the members would move most.
				if moved > n/2 {
					t.Errorf("%d partitions, %d -> %d members: %d moved between the others, more than half", n, len(live)-1, len(live), moved)
				}
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

// A member that stops announcing without deleting its key (one that
// crashed) is live while its key is newer than a TTL on the reader's
// clock, and gone once the reader has seen it unchanged for a whole TTL:
// its partitions go to the members left.
func TestMemberNotRenewedForATTLIsGone(t *testing.T) {
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 600 * time.Millisecond
	parts := []string{"y.p00", "y.p01", "y.p02", "y.p03"}
	ctx := context.Background()
	open := func(holder string) *lease.Members {
		m, err := lease.OpenMembers(ctx, js, "y", holder, parts, ttl, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return m
	}
	a, b := open("a"), open("b")
	// shared reports whether a or b, not both, wants each partition.
	shared := func() bool {
		for _, p := range parts {
			if a.Wants(p) == b.Wants(p) {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, "a and b to share the partitions", 10*time.Second, shared)

	// The crashed member's key, written once, as its last announcement.
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	crashed := lease.MemberID("crashed")
	put := time.Now()
	if _, err := kv.Put(ctx, "y.members."+crashed, fmt.Appendf(nil, `{"holder":"crashed","renewed":%q}`, put.UTC().Format(time.RFC3339Nano))); err != nil {
		t.Fatal(err)
	}
	counts := func(m *lease.Members) bool { return slices.Contains(m.Live(), crashed) }
	testenv.Eventually(t, "a and b to count the crashed member live", ttl/2, func() bool { return counts(a) && counts(b) })
	// Three live members, four partitions: one at least is the crashed
	// member's, wanted by neither a nor b.
	if shared() {
		t.Fatal("a and b want every partition while the crashed member is live")
	}

	testenv.Eventually(t, "a and b to count the crashed member gone", 4*ttl, func() bool { return !counts(a) && !counts(b) })
	if since := time.Since(put); since < ttl {
		t.Fatalf("the crashed member gone %v after its last announcement, before a TTL (%v)", since, ttl)
	}
	testenv.Eventually(t, "a and b to share the partitions again", ttl, shared)
	if !slices.Equal(a.Live(), b.Live()) || len(a.Live()) != 2 {
		t.Fatalf("live members after the expiry: a %v, b %v; want a and b alone", a.Live(), b.Live())
	}
}
