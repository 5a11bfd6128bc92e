// Package retry is converge's one backoff: exponential, capped, with
// jitter, and a wait that honours its context. The projector, the
// notifier, the embedder and the rebuild manager all use it, so that a
// failing dependency sees the same shape of retries from every service.
package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff is the delay before a retry: Min after the first failure,
// doubled per further failure, capped at Max, of which a random part
// (Jitter) spreads the retries of callers that failed together.
type Backoff struct {
	Min time.Duration // the delay after the first failure; default 100ms
	Max time.Duration // the delay at most; default 30s (and never below Min)
	// Jitter is the fraction of each delay that is random, in [0, 1]:
	// a delay d becomes d*(1-Jitter) + rand[0, d*Jitter]. 0 means the
	// default, 0.5; NoJitter turns it off.
	Jitter float64
}

// NoJitter as Backoff.Jitter makes every delay exact (tests, and a
// single caller that has nobody to spread out from).
const NoJitter = -1.0

func (b Backoff) bounds() (lo, hi time.Duration) {
	lo, hi = b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 30 * time.Second
	}
	return lo, max(hi, lo)
}

// Delay is the wait after failure number attempt (the first failure is
// 1; anything below counts as 1).
func (b Backoff) Delay(attempt int) time.Duration {
	lo, hi := b.bounds()
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	j := b.Jitter
	switch {
	case j == 0:
		j = 0.5
	case j < 0:
		return d
	case j > 1:
		j = 1
	}
	spread := time.Duration(float64(d) * j)
	if spread <= 0 {
		return d
	}
	return d - spread + rand.N(spread+1) //nolint:gosec // jitter needs no cryptographic randomness
}

// Wait sleeps the delay after failure number attempt; it returns
// ctx.Err() at once when ctx ends first, nil otherwise.
func (b Backoff) Wait(ctx context.Context, attempt int) error {
	return Sleep(ctx, b.Delay(attempt))
}

// Sleep waits d, or until ctx ends: then it returns ctx.Err().
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do calls fn until it succeeds, fn's error is Permanent, attempts calls
// have failed (attempts <= 0: no bound), or ctx ends; between calls it
// waits b's delay. It returns fn's last error (unwrapped from Permanent),
// or ctx's error joined to it when ctx ended first. A Permanent error
// wrapped in another (fmt.Errorf with %w) is permanent too.
func Do(ctx context.Context, b Backoff, attempts int, fn func(ctx context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if p, ok := err.(permanent); ok { //nolint:errorlint // exactly a Permanent: its cause is the answer; a wrapped one is below

			return p.err
		}
		if errors.As(err, new(permanent)) {
			return err // wrapped: its text is already the cause's
		}
		if attempts > 0 && attempt >= attempts {
			return err
		}
		if werr := b.Wait(ctx, attempt); werr != nil {
			return &stopped{ctx: werr, last: err}
		}
	}
}

// Permanent marks an error that Do must not retry.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// stopped is the error of a Do whose context ended between attempts: it
// is both the context's error and the last attempt's.
type stopped struct{ ctx, last error }

func (s *stopped) Error() string   { return s.ctx.Error() + " (last attempt: " + s.last.Error() + ")" }
func (s *stopped) Unwrap() []error { return []error{s.ctx, s.last} }
