package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/retry"
)

// States of an effect's record in the dedup store.
const (
	stateClaimed = "claimed" // a sender is sending (or crashed while sending)
	stateSent    = "sent"    // answered 2xx: never sent again while the record lives
	stateFailed  = "failed"  // the last attempt failed; the next one is due at Next
	stateDead    = "dead"    // MaxAttempts failed; the event is being dead-lettered
)

// record is the value of an effect's key (its id) in the dedup store.
type record struct {
	State    string    `json:"state"`
	Attempts int       `json:"attempts"`       // attempts so far, the one in flight included
	At       time.Time `json:"at"`             // when the record entered its state (its writer's clock)
	Next     time.Time `json:"next,omitzero"`  // failed: At plus the backoff's delay
	Owner    string    `json:"owner"`          // the process that wrote the record
	EventID  string    `json:"event_id"`       // for an operator reading the bucket
	Target   string    `json:"target"`         // the target's public name (targetNames)
	Last     string    `json:"last,omitempty"` // failed, dead: the last failure
}

func (n *Notifier) newRecord(j *job, state string, attempts int, at time.Time) record {
	return record{State: state, Attempts: attempts, At: at, Owner: n.cfg.Owner, EventID: j.ev.ID.String(), Target: j.target.name}
}

func (r record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a struct of strings, ints and times always encodes
	}
	return b
}

// kvTimeout bounds one operation on the dedup store.
const kvTimeout = 10 * time.Second

// casRounds bounds the compare-and-set races lost in a row before a claim
// gives up (it is retried with the event).
const casRounds = 5

// claimed is a claim this process holds on an effect.
type claimed struct {
	rev     uint64 // revision of the "claimed" record
	attempt int    // the attempt about to be made
	sent    bool   // the effect was sent, but marking it failed: mark only
}

// claim takes the effect for one attempt: it creates its record if absent,
// or moves it to "claimed" by compare-and-set from "failed" (backoff over)
// or from a "claimed" record this process has seen unchanged for
// ClaimTimeout. Otherwise the effect's outcome is known without sending: a
// duplicate, a claim to wait for, a backoff to wait for, or a dead effect.
//
// The wall times in a record are its writer's, for people; how long a
// claim or a backoff has lasted is measured here, on the monotonic clock
// (see sightings), so that no step of a clock, this one's or the
// writer's, makes a live claim look stale or holds an effect back.
func (n *Notifier) claim(j *job) (claimed, *outcome) {
	key := j.effect.String()
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	for range casRounds {
		now := n.cfg.Clock.Now()
		e, err := n.kv.Get(ctx, key)
		seen := time.Now() // after the read: the record is at least as old as seen
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			rev, err := n.kv.Create(ctx, key, n.newRecord(j, stateClaimed, 1, now).encode())
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // claimed meanwhile: look again
			}
			if err != nil {
				return claimed{}, storeFailure("claim", key, err)
			}
			n.sightings.wrote(key, rev, time.Now())
			return claimed{rev: rev, attempt: 1}, nil
		}
		if err != nil {
			return claimed{}, storeFailure("read", key, err)
		}
		var rec record
		unreadable := false
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			// Only this package writes the bucket; a record it cannot read
			// is treated as a stale claim, and taken over.
			n.log.Warn("unreadable effect record; taking it over", "effect", key, "err", err)
			rec, unreadable = record{State: stateClaimed}, true
		}
		switch rec.State {
		case stateSent:
			n.sightings.forget(key)
			n.metrics.Deduplicated.WithLabelValues(j.target.name).Inc()
			return claimed{}, &outcome{kind: duplicate}
		case stateDead:
			return claimed{}, &outcome{kind: dead, rev: e.Revision(),
				err: fmt.Errorf("%s (gave up after %d attempts)", lastFailure(rec, j.target), rec.Attempts)}
		case stateFailed:
			if wait := backoffLeft(rec, now, n.sightings.since(key, e.Revision(), seen)); wait > 0 {
				return claimed{}, &outcome{kind: later, after: wait,
					err: fmt.Errorf("%s (attempt %d of %d failed; the next is due in %v)", lastFailure(rec, j.target), rec.Attempts, n.cfg.MaxAttempts, wait.Round(time.Millisecond))}
			}
		default: // claimed, or unreadable
			n.mu.Lock()
			sentRev, sent := n.unmarked[j.effect]
			n.mu.Unlock()
			if sent && sentRev == e.Revision() {
				return claimed{rev: sentRev, attempt: rec.Attempts, sent: true}, nil
			}
			held := n.sightings.since(key, e.Revision(), seen)
			if !unreadable && held < n.cfg.ClaimTimeout {
				return claimed{}, &outcome{kind: later, after: n.cfg.ClaimTimeout - held,
					err: fmt.Errorf("webhook %s: effect %s is claimed by %s (unchanged for %v here; claimed at %v by its clock)",
						j.target.name, key, rec.Owner, held.Round(time.Millisecond), rec.At.Format(time.RFC3339Nano))}
			}
			n.metrics.TakenOver.WithLabelValues(j.target.name).Inc()
			n.log.Info("taking over a stale claim: the effect is sent again, with the same Idempotency-Key",
				"effect", key, "target", j.target.name, "owner", rec.Owner, "claimed_at", rec.At, "unchanged_for", held)
		}
		attempt := rec.Attempts + 1
		rev, err := n.kv.Update(ctx, key, n.newRecord(j, stateClaimed, attempt, now).encode(), e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return claimed{}, storeFailure("claim", key, err)
		}
		n.sightings.wrote(key, rev, time.Now())
		return claimed{rev: rev, attempt: attempt}, nil
	}
	return claimed{}, storeFailure("claim", key, fmt.Errorf("the record changed %d times in a row", casRounds))
}

// lastFailure is a record's last failure, as an error of t may quote it:
// a record written by an older notifier, whose target names kept the
// URL's path, may quote that path.
func lastFailure(rec record, t *target) string { return hide(rec.Last, t.hidden) }

// backoffLeft is how long the backoff of a failed record still runs, the
// record seen here for seenFor: its delay (Next-At, two readings of its
// writer's clock taken together, so no clock's step changes it) less
// seenFor, or less if its wall times say so (a record first seen long
// after it was written, by a process started since). A clock here behind
// the writer's cannot hold the effect back beyond its delay; one ahead
// may end the backoff early, which costs an early attempt, never a second
// send (the claim is a compare-and-set).
func backoffLeft(rec record, now time.Time, seenFor time.Duration) time.Duration {
	return min(rec.Next.Sub(now), rec.Next.Sub(rec.At)-seenFor)
}

// markSent records a 2xx answer.
func (n *Notifier) markSent(j *job, c claimed) outcome {
	key := j.effect.String()
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	_, err := n.kv.Update(ctx, key, n.newRecord(j, stateSent, c.attempt, n.cfg.Clock.Now()).encode(), c.rev)
	switch {
	case err == nil:
		n.sightings.forget(key)
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		n.sightings.forget(key)
		// The request outlived ClaimTimeout and another sender took the
		// claim over: it sends again, with the same key.
		n.log.Warn("the claim was taken over while the effect was being sent; the receiver will see it twice, with the same Idempotency-Key",
			"effect", key, "target", j.target.name)
	default:
		// Remembered, so that the retry marks it without sending again
		// (unless this process ends first: the claim is then taken over).
		n.mu.Lock()
		n.unmarked[j.effect] = c.rev
		n.mu.Unlock()
		return *storeFailure("mark sent", key, err)
	}
	n.mu.Lock()
	delete(n.unmarked, j.effect)
	n.mu.Unlock()
	return outcome{kind: sent}
}

// markFailed records a failed attempt: "failed" with the next attempt's
// time, or "dead" after MaxAttempts.
func (n *Notifier) markFailed(j *job, c claimed, failure error) outcome {
	key := j.effect.String()
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	now := n.cfg.Clock.Now()
	rec := n.newRecord(j, stateFailed, c.attempt, now)
	rec.Last = failure.Error()
	delay := n.backoff(c.attempt)
	if c.attempt >= n.cfg.MaxAttempts {
		rec.State = stateDead
	} else {
		rec.Next = now.Add(delay)
	}
	rev, err := n.kv.Update(ctx, key, rec.encode(), c.rev)
	if err == nil {
		n.sightings.wrote(key, rev, time.Now())
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return outcome{kind: later, after: n.cfg.RetryMin, err: failure} // taken over meanwhile: its owner goes on
	case err != nil:
		// The claim stays and is taken over after ClaimTimeout.
		return *storeFailure("record the failure of", key, fmt.Errorf("%w (the attempt: %w)", err, failure))
	case rec.State == stateDead:
		n.metrics.DeadLettered.WithLabelValues(j.target.name).Inc()
		n.log.Warn("notification given up; its event is dead-lettered", "effect", key, "target", j.target.name,
			"key", j.ev.Key, "version", j.ev.Version, "attempts", c.attempt, "err", failure)
		return outcome{kind: dead, rev: rev, err: fmt.Errorf("%w (gave up after %d attempts)", failure, c.attempt)}
	default:
		n.metrics.Retried.WithLabelValues(j.target.name).Inc()
		n.log.Info("notification failed; retrying", "effect", key, "target", j.target.name, "attempt", c.attempt,
			"max_attempts", n.cfg.MaxAttempts, "in", delay, "err", failure)
		return outcome{kind: later, after: delay, err: failure}
	}
}

// reset deletes the record of a dead effect, whose event is being
// dead-lettered, so that a redrive of the dead letter starts afresh.
func (n *Notifier) reset(j *job, rev uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	n.sightings.forget(j.effect.String())
	err := n.kv.Delete(ctx, j.effect.String(), jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("notifier: reset effect %s: %w", j.effect, err)
	}
	return nil
}

func storeFailure(what, key string, err error) *outcome {
	return &outcome{kind: storeFailed, err: fmt.Errorf("notifier: %s effect %s: %w", what, key, err)}
}

// backoff is the delay after failed attempt number attempt: the shared
// backoff over RetryMin and RetryMax, half of it random, so that the
// retries of many effects that failed together spread out.
func (n *Notifier) backoff(attempt int) time.Duration {
	return retry.Backoff{Min: n.cfg.RetryMin, Max: n.cfg.RetryMax}.Delay(attempt)
}
