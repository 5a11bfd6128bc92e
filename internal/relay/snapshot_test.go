package relay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestSnapshotSeesWhatEndedBeforeIt(t *testing.T) {
	s, err := parseSnapshot("100:110:104,107")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{99: true, 100: true, 103: true, 104: false, 107: false, 109: true, 110: false, 200: false} {
		if got := s.complete(xid); got != want {
			t.Errorf("xid %d: complete %v, want %v", xid, got, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x", "5:4:"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("snapshot %q parsed", bad)
		}
	}
}

// Logical decoding names a transaction by its 32-bit id; the snapshot's
// are 64-bit, epoch and id: near an epoch's end the two must still match.
func TestSnapshotAcrossAnEpoch(t *testing.T) {
	const epoch = uint64(1) << 32
	s, err := parseSnapshot("4294967290:4294967300:4294967295")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{4294967289: true, 4294967294: true, 4294967295: false, 1: true, 3: true, 4: false, 10: false} {
		if got := s.complete(xid); got != want {
			t.Errorf("xid %d near the epoch's end: complete %v, want %v", xid, got, want)
		}
	}
	if got := widenXID(5, 3*epoch+10); got != 3*epoch+5 {
		t.Errorf("widen 5 near 3:10 = %d", got)
	}
	if got := widenXID(4294967295, 3*epoch+10); got != 3*epoch-1 {
		t.Errorf("widen 2^32-1 near 3:10 = %d, want the epoch before", got)
	}
	if got := widenXID(20, 3*epoch+4294967290); got != 4*epoch+20 {
		t.Errorf("widen 20 near 3:(2^32-6) = %d, want the next epoch", got)
	}
}

// Marked every second for an hour, the marks kept are the newest and one
// in each range of ages: whatever a standby lagged, within half an hour,
// one of them is old enough.
func TestKeepMarksSpacesThemOut(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var marks []Mark
	for i := range 3600 {
		marks = keepMarks(Mark{At: now.Add(time.Duration(i) * time.Second)}, marks)
		if len(marks) > 1+len(markBuckets) {
			t.Fatalf("%d marks kept", len(marks))
		}
		// For a standby lagging lag, a mark at least that old, not much
		// older (the catch-up reads what it does not see).
		for _, c := range []struct{ lag, within time.Duration }{
			{5 * time.Second, time.Minute}, {30 * time.Second, 5 * time.Minute}, {3 * time.Minute, 30 * time.Minute}, {20 * time.Minute, time.Hour},
		} {
			if time.Duration(i)*time.Second < c.within {
				continue
			}
			found := false
			for _, m := range marks {
				if age := marks[0].At.Sub(m.At); age >= c.lag && age <= c.within {
					found = true
				}
			}
			if !found {
				t.Fatalf("after %d s no mark is between %v and %v old: %v", i, c.lag, c.within, marks)
			}
		}
	}
	var ages []time.Duration
	for _, m := range marks {
		ages = append(ages, marks[0].At.Sub(m.At))
	}
	t.Logf("ages kept after an hour: %v", ages)
}

func TestTimelineSwitch(t *testing.T) {
	history := []byte("1\t0/3000060\tno recovery target specified\n\n2\t0/5000000\tno recovery target specified\n")
	if lsn, ok := timelineSwitch(history, 1); !ok || lsn.String() != "0/3000060" {
		t.Errorf("timeline 1 ends at %s, %v", lsn, ok)
	}
	if lsn, ok := timelineSwitch(history, 2); !ok || lsn.String() != "0/5000000" {
		t.Errorf("timeline 2 ends at %s, %v", lsn, ok)
	}
	if _, ok := timelineSwitch(history, 3); ok {
		t.Error("timeline 3 is not in the history")
	}
}

// A step of the relay's clock back by an hour keeps an older mark: the
// marks taken before it look newer than the new ones, yet the oldest of
// them still bounds a catch-up, until marks taken since are old enough.
func TestKeepMarksAcrossAClockStepBack(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var marks []Mark
	lsn := pglogrepl.LSN(1 << 24)
	mark := func(at time.Time) {
		lsn += 4096
		marks = keepMarks(Mark{LSN: lsn.String(), At: at}, marks)
	}
	for i := range 600 {
		mark(now.Add(time.Duration(i) * time.Second))
	}
	firstKept := marks[len(marks)-1].lsn()
	stepped := now.Add(600*time.Second - time.Hour)
	for i := range 120 {
		mark(stepped.Add(time.Duration(i) * time.Second))
		if len(marks) < 2 {
			t.Fatalf("%d s after the step back: only the newest mark is kept", i)
		}
		if oldest := marks[len(marks)-1].lsn(); oldest > firstKept {
			t.Fatalf("%d s after the step back: the oldest mark kept is at %s, younger than %s kept before", i, oldest, firstKept)
		}
	}
}
