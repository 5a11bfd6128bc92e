package notifier

import (
	"sync"
	"time"
)

// sightings remember, per effect record, when this process first saw its
// current revision, on its monotonic clock. A claim's staleness and the
// end of a backoff are judged from them rather than from the wall times in
// the records, which were read from the clock of whichever process wrote
// them: clocks disagree, and step forward or back. The rule is package
// lease's: a record is known to be at least as old as the time this
// process has seen it unchanged.
type sightings struct {
	mu   sync.Mutex
	seen map[string]sighting
	// forgetAfter bounds the memory of effects this process stopped
	// handling (another instance took their events over): a sighting
	// older than that is dropped; seen again, the record's age starts
	// again from zero, which delays it once more, never sends it twice.
	forgetAfter time.Duration
	swept       time.Time
}

type sighting struct {
	rev uint64
	at  time.Time // monotonic
}

func newSightings(forgetAfter time.Duration) *sightings {
	return &sightings{seen: map[string]sighting{}, forgetAfter: forgetAfter, swept: time.Now()}
}

// since is how long this process has seen key at revision rev, now being
// the first time unless it saw (or wrote) that revision before.
func (s *sightings) since(key string, rev uint64, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.seen[key]; ok && prev.rev == rev {
		return now.Sub(prev.at)
	}
	s.put(key, sighting{rev: rev, at: now})
	return 0
}

// wrote remembers that this process wrote revision rev of key, at a
// reading taken once the write was stored: the record is at least as old.
func (s *sightings) wrote(key string, rev uint64, stored time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(key, sighting{rev: rev, at: stored})
}

// forget drops key: its effect is done (sent, or its record deleted).
func (s *sightings) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}

func (s *sightings) put(key string, v sighting) {
	s.seen[key] = v
	if v.at.Sub(s.swept) < s.forgetAfter {
		return
	}
	for k, old := range s.seen {
		if v.at.Sub(old.at) > s.forgetAfter {
			delete(s.seen, k)
		}
	}
	s.swept = v.at
}

func (s *sightings) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}
