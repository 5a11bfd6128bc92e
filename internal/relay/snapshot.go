package relay

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// pgSnapshot is a pg_current_snapshot(): every transaction below xmin is
// complete, none from xmax on had begun, and xip lists those in between
// still running. Transaction ids are 64-bit (xid8): epoch and xid.
type pgSnapshot struct {
	xmin, xmax uint64
	xip        []uint64 // ascending
	text       string   // as Postgres printed it
}

// parseSnapshot reads the text form of a pg_snapshot, "xmin:xmax:xip,...".
func parseSnapshot(s string) (pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("relay: snapshot %q: want xmin:xmax:xip", s)
	}
	snap := pgSnapshot{text: s}
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("relay: snapshot %q: xmin: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("relay: snapshot %q: xmax: %w", s, err)
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return pgSnapshot{}, fmt.Errorf("relay: snapshot %q: xip: %w", s, err)
			}
			snap.xip = append(snap.xip, x)
		}
		slices.Sort(snap.xip)
	}
	if snap.xmin > snap.xmax {
		return pgSnapshot{}, fmt.Errorf("relay: snapshot %q: xmin above xmax", s)
	}
	return snap, nil
}

// complete reports whether the transaction xid (32 bits, as logical
// decoding names it) had ended when the snapshot was taken: for a
// transaction that committed, that it was visible.
func (s pgSnapshot) complete(xid uint32) bool {
	x := widenXID(xid, s.xmax)
	if x < s.xmin {
		return true
	}
	if x >= s.xmax {
		return false
	}
	_, running := slices.BinarySearch(s.xip, x)
	return !running
}

// widenXID is the 64-bit transaction id whose low 32 bits are xid and
// which is nearest to near: a transaction being decoded is within 2^31
// of any recent snapshot's xmax.
func widenXID(xid uint32, near uint64) uint64 {
	x := near&^0xFFFFFFFF | uint64(xid)
	switch {
	case x > near && x-near > 1<<31 && x >= 1<<32:
		x -= 1 << 32
	case x < near && near-x > 1<<31:
		x += 1 << 32
	}
	return x
}

// Mark is a snapshot of Postgres every transaction of which (every one
// the snapshot sees) is in the streams: the relay took it at a moment when
// the WAL ended at LSN, and recorded it once it had confirmed a position
// at or past that LSN. Rows whose transaction the snapshot does not see
// are the most a catch-up from it must read again.
type Mark struct {
	Snapshot string    `json:"snapshot"`
	LSN      string    `json:"lsn"`
	Timeline int32     `json:"timeline"`
	At       time.Time `json:"at"`
}

func (m Mark) lsn() pglogrepl.LSN {
	lsn, _ := pglogrepl.ParseLSN(m.LSN)
	return lsn
}

// before reports whether m was taken before o: by LSN, which no clock
// moves; by time when they have the same.
func (m Mark) before(o Mark) bool {
	if a, b := m.lsn(), o.lsn(); a != b {
		return a < b
	}
	return m.At.Before(o.At)
}

// markBuckets are the ages (from the newest mark) of the ranges in each
// of which the oldest mark is kept, beside the newest: after a failover
// to a standby whose WAL ends before the newest mark's LSN, an older one
// still bounds the catch-up. Marks flow through the ranges as they age.
var markBuckets = []time.Duration{0, 10 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute}

// keepMarks puts m before marks (newest first) and keeps, beside it, the
// oldest mark of each of markBuckets' ranges.
//
// Ages are differences of wall times, which a step of the relay's clock
// (or a relay on another host) upsets: a mark that looks newer than m
// (the clock stepped back) counts in the first range, and which mark is
// the oldest is told by LSN, so that a step keeps an older mark rather
// than none.
func keepMarks(m Mark, marks []Mark) []Mark {
	oldest := make([]int, len(markBuckets)) // per range, an index into marks, or -1
	for i := range oldest {
		oldest[i] = -1
	}
	for j, old := range marks {
		age := max(m.At.Sub(old.At), 0)
		r := len(markBuckets) - 1
		for r > 0 && age < markBuckets[r] {
			r--
		}
		if oldest[r] < 0 || old.before(marks[oldest[r]]) {
			oldest[r] = j
		}
	}
	out := []Mark{m}
	for _, j := range oldest { // the ranges in order of age
		if j >= 0 {
			out = append(out, marks[j])
		}
	}
	return out
}

// timelineSwitch reads, from the history file of the server's timeline
// (TIMELINE_HISTORY), the LSN at which timeline tli ended and the next
// began; false when tli is not in that history.
func timelineSwitch(history []byte, tli int32) (pglogrepl.LSN, bool) {
	for _, line := range strings.Split(string(history), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		t, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || int32(t) != tli {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return 0, false
		}
		return lsn, true
	}
	return 0, false
}
