package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestDelayDoublesToCap(t *testing.T) {
	b := Backoff{Min: time.Second, Max: 10 * time.Second, Jitter: NoJitter}
	want := []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for attempt, w := range want {
		if got := b.Delay(attempt); got != w {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, w)
		}
	}
	if got := b.Delay(1 << 20); got != 10*time.Second {
		t.Errorf("a huge attempt: %v, want the cap", got)
	}
}

func TestDelayJitterStaysInRange(t *testing.T) {
	b := Backoff{Min: time.Second, Max: time.Second, Jitter: 0.5}
	seen := map[bool]bool{}
	for range 200 {
		d := b.Delay(3)
		if d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("delay %v outside [500ms, 1s]", d)
		}
		seen[d < 750*time.Millisecond] = true
	}
	if !seen[true] || !seen[false] {
		t.Fatalf("200 jittered delays all fell on one side of the middle: no jitter")
	}
}

func TestDefaults(t *testing.T) {
	var b Backoff
	b.Jitter = NoJitter
	if got := b.Delay(1); got != 100*time.Millisecond {
		t.Errorf("default Min: %v", got)
	}
	if got := b.Delay(100); got != 30*time.Second {
		t.Errorf("default Max: %v", got)
	}
	if got := (Backoff{Min: time.Minute, Max: time.Second, Jitter: NoJitter}).Delay(5); got != time.Minute {
		t.Errorf("a Max below Min is Min: %v", got)
	}
}

func TestDoStopsOnSuccessPermanentAndAttempts(t *testing.T) {
	b := Backoff{Min: time.Microsecond, Max: time.Microsecond}
	calls := 0
	if err := Do(context.Background(), b, 0, func(context.Context) error {
		if calls++; calls < 3 {
			return errors.New("transient")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Fatalf("success on the third call: err %v, calls %d", err, calls)
	}
	fatal := errors.New("fatal")
	calls = 0
	if err := Do(context.Background(), b, 0, func(context.Context) error { calls++; return Permanent(fatal) }); err != fatal || calls != 1 { //nolint:errorlint // the cause itself, unwrapped

		t.Fatalf("permanent: err %v, calls %d", err, calls)
	}
	// Wrapped on its way up, it is still permanent.
	calls = 0
	err := Do(context.Background(), b, 5, func(context.Context) error { calls++; return fmt.Errorf("open: %w", Permanent(fatal)) })
	if !errors.Is(err, fatal) || err.Error() != "open: fatal" || calls != 1 {
		t.Fatalf("wrapped permanent: err %v, calls %d", err, calls)
	}
	calls = 0
	if err := Do(context.Background(), b, 4, func(context.Context) error { calls++; return errors.New("again") }); err == nil || calls != 4 {
		t.Fatalf("bounded: err %v, calls %d", err, calls)
	}
}

func TestDoHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	last := errors.New("down")
	done := make(chan error)
	go func() {
		done <- Do(ctx, Backoff{Min: time.Hour, Max: time.Hour}, 0, func(context.Context) error { return last })
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, last) {
			t.Fatalf("err %v: want both context.Canceled and the last attempt's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do kept waiting an hour's backoff after its context was canceled")
	}
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a canceled context: %v", err)
	}
}
