// The errors a store returns to tell the runtime what to do with a
// message other than retry its write in place ([Permanent], [Redeliver],
// [DeadLetter]), and the one that ends Run when this instance may no
// longer write ([FencedError]).

package projector

import (
	"errors"
	"time"
)

// Permanent marks err as one that retrying cannot fix: the store rejects
// the data itself.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err was marked [Permanent], or is (or
// wraps) an error whose Permanent method says so: store adapters classify
// their own failures that way.
func IsPermanent(err error) bool {
	var p *permanentError
	if errors.As(err, &p) {
		return true
	}
	var c interface{ Permanent() bool }
	return errors.As(err, &c) && c.Permanent()
}

// Redeliver marks err as a failure that the store will retry itself, on a
// later delivery: the runtime naks the message with the delay after
// (whatever MaxDeliver says: the store counts its own attempts and gives
// up with [DeadLetter]), and goes on with the stream meanwhile.
func Redeliver(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &RedeliverError{Err: err, After: max(after, 0)}
}

// RedeliverError is the error [Redeliver] returns.
type RedeliverError struct {
	Err   error
	After time.Duration
}

func (e *RedeliverError) Error() string { return e.Err.Error() }
func (e *RedeliverError) Unwrap() error { return e.Err }

// DeadLetter marks err as the reason to dead-letter the event's message at
// once, under code (a stable word, such as "webhook_failed"): the store
// has given up on it.
func DeadLetter(code string, err error) error {
	if err == nil {
		return nil
	}
	return &DeadLetterError{Code: code, Err: err}
}

// DeadLetterError is the error [DeadLetter] returns.
type DeadLetterError struct {
	Code string
	Err  error
}

func (e *DeadLetterError) Error() string { return e.Err.Error() }
func (e *DeadLetterError) Unwrap() error { return e.Err }

// retryInPlace reports whether err is transient: the runtime retries it in
// place rather than naking or dead-lettering the message.
func retryInPlace(err error) bool {
	var rd *RedeliverError
	var dl *DeadLetterError
	var fe *FencedError
	return err != nil && !IsPermanent(err) && !errors.As(err, &rd) && !errors.As(err, &dl) && !errors.As(err, &fe)
}

// FencedError is Run's end when Config.Fence refused a write.
type FencedError struct{ Err error }

func (e *FencedError) Error() string {
	return "projector: no longer the writer of its store: " + e.Err.Error()
}
func (e *FencedError) Unwrap() error { return e.Err }
