// Publishing failures, remembered across sessions for /readyz
// ([Relay.Publishing]) and the relay_publish_failing metric.

package relay

import (
	"context"
	"fmt"
	"time"
)

// publishFailure is when publishing began to fail, when it failed last,
// and the latest error.
type publishFailure struct {
	since, last time.Time
	err         string
}

// PublishAlarm is how long publishing may fail before the relay reports
// itself not ready (see [Relay.Publishing]).
const PublishAlarm = 5 * time.Second

// Publishing returns an error, for /readyz, once the sessions of the last
// PublishAlarm or more failed to publish and none stored an event since:
// JetStream refuses to store (a limit an operator set), or answers
// nothing. A NATS server that met ENOSPC logs it and answers no publish
// to that stream until it restarts, even once its disk has room again,
// while its own health check stays green: this is where that shows. Two
// relays take the slot in turn while each session fails; the failure
// spans the turns of standby between, and is forgotten once no session
// failed for a while (a standby that has not published since).
func (r *Relay) Publishing(context.Context) error {
	f := r.failing.Load()
	if f == nil {
		return nil
	}
	if time.Since(f.last) > r.failureMemory() {
		r.failing.CompareAndSwap(f, nil)
		r.metrics.PublishFailing.Set(0)
		return nil
	}
	if d := time.Since(f.since); d >= PublishAlarm {
		return fmt.Errorf("publishing to JetStream has failed for %v (a NATS server that met a full disk stores nothing more until it restarts: see its log): %s", d.Round(time.Second), f.err)
	}
	return nil
}

// failureMemory is how long after its last failure a failure is
// remembered: past a standby's turn (another relay's failing session), a
// retry, and a session that is slow to start on a loaded machine, so that
// the report does not come and go while sessions keep failing.
func (r *Relay) failureMemory() time.Duration {
	return 4 * (max(r.cfg.AckTimeout, PublishAlarm) + r.cfg.StandbyRetry)
}

// notePublishFailure records a failed publish (see Publishing).
func (r *Relay) notePublishFailure(err error) {
	now := time.Now()
	f := &publishFailure{since: now, last: now, err: err.Error()}
	if old := r.failing.Load(); old != nil && now.Sub(old.last) <= r.failureMemory() {
		f.since = old.since
	}
	r.failing.Store(f)
	r.metrics.PublishFailing.Set(1)
}

// clearPublishFailure forgets the failure: JetStream stored an event.
func (r *Relay) clearPublishFailure() {
	if r.failing.Load() != nil {
		r.failing.Store(nil)
		r.metrics.PublishFailing.Set(0)
	}
}
