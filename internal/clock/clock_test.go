package clock

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// near reports whether got is want within a second.
func near(got, want time.Time) bool {
	d := got.Sub(want)
	return d > -time.Second && d < time.Second
}

func TestParseOffset(t *testing.T) {
	for _, tc := range []struct {
		text string
		want time.Duration
		ok   bool
	}{
		{"", 0, true},
		{" \n", 0, true},
		{"90s", 90 * time.Second, true},
		{"+90s", 90 * time.Second, true},
		{"-10m", -10 * time.Minute, true},
		{"-10m0s\n", -10 * time.Minute, true},
		{"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond, true},
		{"0", 0, true},
		{"90", 0, false},
		{"soon", 0, false},
		{"+ 1s", 0, false},
	} {
		got, err := ParseOffset(tc.text)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseOffset(%q) = %v, %v; want %v, ok %v", tc.text, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseOffset(f *testing.F) {
	for _, s := range []string{"", "90s", "+90s", "-10m", " -1h2m3s\n", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		d, err := ParseOffset(text)
		if err != nil {
			return
		}
		back, err := ParseOffset(d.String())
		if err != nil || back != d {
			t.Fatalf("%q: %v does not read back (%v, %v)", text, d, back, err)
		}
	})
}

// A reading carries no monotonic reading: a step of the offset moves every
// duration computed from it, as a step of a host's clock does, while
// durations measured on time.Now do not move.
func TestShiftedStepsTheWallTimeOnly(t *testing.T) {
	var s Shifted
	start := time.Now()
	before := s.Now()
	if before != before.Round(0) {
		t.Fatalf("Now %v carries a monotonic reading", before)
	}
	if !near(before, time.Now()) || s.Offset() != 0 {
		t.Fatalf("the zero Shifted reads %v (offset %v), want the system's time", before, s.Offset())
	}
	s.Jump(-time.Hour)
	after := s.Now()
	if d := after.Sub(before); d > -59*time.Minute || d < -61*time.Minute {
		t.Fatalf("after a step back of 1h, Now moved by %v", d)
	}
	if time.Since(start) > time.Minute {
		t.Fatal("the step moved the monotonic clock")
	}
	s.Jump(90 * time.Second)
	if s.Offset() != -time.Hour+90*time.Second || !near(s.Now(), time.Now().Add(s.Offset())) {
		t.Fatalf("offset %v, Now %v", s.Offset(), s.Now())
	}
	if got := NewShifted(time.Minute).Now(); !near(got, time.Now().Add(time.Minute)) {
		t.Fatalf("NewShifted(1m).Now() = %v", got)
	}
}

// logs is a logger and what it wrote.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(b []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(b) }
func (l *logs) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}
func (l *logs) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func write(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestFaultFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clock")
	var l logs
	f := OpenFaultFile(path, l.logger())
	f.every = 0 // read at every reading
	f.next.Store(0)
	offset := func() time.Duration {
		t.Helper()
		now := f.Now()
		if now != now.Round(0) {
			t.Fatalf("Now %v carries a monotonic reading", now)
		}
		off := time.Until(now)
		return off.Round(time.Second)
	}
	if got := offset(); got != 0 {
		t.Fatalf("no file: offset %v", got)
	}
	write(t, path, "+90s\n")
	if got := offset(); got != 90*time.Second || f.Offset() != 90*time.Second {
		t.Fatalf("+90s: offset %v (%v)", got, f.Offset())
	}
	write(t, path, "-10m")
	if got := offset(); got != -10*time.Minute {
		t.Fatalf("-10m: offset %v", got)
	}
	// What cannot be read keeps the last offset, and is logged once.
	write(t, path, "ten minutes")
	for range 3 {
		if got := offset(); got != -10*time.Minute {
			t.Fatalf("unparseable: offset %v, want the last one", got)
		}
	}
	if n := l.count("unreadable"); n != 1 {
		t.Fatalf("unparseable content logged %d times, want once:\n%s", n, l.buf.String())
	}
	write(t, path, strings.Repeat(" ", maxFileBytes)+"1s")
	if got := offset(); got != -10*time.Minute || l.count("unreadable") != 2 {
		t.Fatalf("too long: offset %v, %d logs", got, l.count("unreadable"))
	}
	write(t, path, "")
	if got := offset(); got != 0 {
		t.Fatalf("empty: offset %v", got)
	}
	write(t, path, "1h")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := offset(); got != 0 {
		t.Fatalf("removed: offset %v", got)
	}
	if n := l.count("steps"); n != 3 {
		t.Fatalf("%d steps logged, want 3 (to +90s, -10m and 0):\n%s", n, l.buf.String())
	}
}

// The file is read again within Reread of a change, not at every reading.
func TestFaultFileIsReadAgainWithinReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clock")
	write(t, path, "1h")
	f := OpenFaultFile(path, slog.New(slog.DiscardHandler))
	if f.Offset() != time.Hour {
		t.Fatalf("offset %v at open, want 1h", f.Offset())
	}
	write(t, path, "-1h")
	changed := time.Now()
	for f.Now(); f.Offset() != -time.Hour; f.Now() {
		if time.Since(changed) > 10*Reread {
			t.Fatalf("offset %v %v after the file changed", f.Offset(), time.Since(changed))
		}
		time.Sleep(Reread / 10)
	}
	// Between two reads the file is not read: a change shows at the
	// next one only.
	f.next.Store(int64(time.Since(f.start) + time.Hour))
	write(t, path, "2h")
	if f.Now(); f.Offset() != -time.Hour {
		t.Fatalf("read again before its time: offset %v", f.Offset())
	}
}

func BenchmarkFaultFileNow(b *testing.B) {
	path := filepath.Join(b.TempDir(), "clock")
	if err := os.WriteFile(path, []byte("1s"), 0o600); err != nil {
		b.Fatal(err)
	}
	f := OpenFaultFile(path, slog.New(slog.DiscardHandler))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			f.Now()
		}
	})
}

// childOffsetEnv makes TestWallChild report Wall's offset.
const childOffsetEnv = "CONVERGE_CLOCK_TEST_CHILD"

// Wall honours EnvFaultFile in a process started with it.
func TestWall(t *testing.T) {
	if now := Wall().Now(); now != now.Round(0) || !near(now, time.Now()) {
		t.Fatalf("Wall().Now() = %v", now)
	}
	path := filepath.Join(t.TempDir(), "clock")
	write(t, path, "-25m")
	cmd := exec.Command(os.Args[0], "-test.run=^TestWallChild$", "-test.v")
	cmd.Env = append(os.Environ(), EnvFaultFile+"="+path, childOffsetEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "offset=-25m0s") {
		t.Fatalf("child's output, want offset=-25m0s:\n%s", out)
	}
}

func TestWallChild(t *testing.T) {
	if os.Getenv(childOffsetEnv) == "" {
		t.Skip("run by TestWall")
	}
	off := time.Until(Wall().Now()).Round(time.Minute)
	t.Logf("offset=%v", off)
}
