package verify

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// The defaults of [WatchConfig].
const (
	// DefaultWatchPass is how long a walk over every bucket takes: with
	// DefaultWatchStep and DefaultBuckets, a step every 60 s, each of which
	// costs Postgres one scan of the documents' keys and the lines of 1/16
	// of the documents (see docs/verification.md for the measured load).
	DefaultWatchPass = 16 * time.Minute
	// DefaultWatchStep is the number of buckets read at each step.
	DefaultWatchStep = 64
	// DefaultWatchWait is how long a step waits for a projection to pass
	// the position Postgres was read at before it leaves the step's
	// buckets unproven for that store.
	DefaultWatchWait = 2 * time.Minute
	// DefaultWatchChecks is how many times a bucket whose digests differ
	// has its documents compared in a row before its step ends.
	DefaultWatchChecks = 4
	// DefaultWatchPoll is how often the projections' progress is asked
	// while a step waits for it.
	DefaultWatchPoll = 250 * time.Millisecond
)

// WatchConfig of a [Watcher].
type WatchConfig struct {
	// Buckets is the number of digest buckets; default [DefaultBuckets].
	Buckets int
	// Pass is how long a walk over every bucket takes at least; default
	// [DefaultWatchPass]. A step runs every Pass*Step/Buckets.
	Pass time.Duration
	// Step is the number of buckets read at once; default
	// [DefaultWatchStep].
	Step int
	// Wait is how long a read waits for a projection to pass its position;
	// default [DefaultWatchWait].
	Wait time.Duration
	// Checks is how many document comparisons in a row a differing bucket
	// gets in one step; default [DefaultWatchChecks], at least 2 (a
	// difference is named when two in a row find it).
	Checks int
	// Poll is how often Progress is asked while waiting; default
	// [DefaultWatchPoll].
	Poll time.Duration
	// Reemitter, when set, repairs each difference named that a
	// re-emission repairs (see [RepairItem.Repairable]).
	Reemitter Reemitter
	// Metrics, when set, are kept current.
	Metrics *WatchMetrics
	// Log is told each difference named, gone or repaired; default
	// slog.Default().
	Log *slog.Logger
}

// Validate checks c and sets its defaults.
func (c *WatchConfig) Validate() error {
	if c.Buckets <= 0 {
		c.Buckets = DefaultBuckets
	}
	if c.Buckets > MaxBuckets {
		return fmt.Errorf("verify: %d buckets, at most %d", c.Buckets, MaxBuckets)
	}
	if c.Pass < 0 || c.Step < 0 || c.Wait < 0 || c.Checks < 0 || c.Poll < 0 {
		return errors.New("verify: the watch's pass, step, wait, checks and poll cannot be negative")
	}
	if c.Pass == 0 {
		c.Pass = DefaultWatchPass
	}
	if c.Step == 0 {
		c.Step = DefaultWatchStep
	}
	c.Step = min(c.Step, c.Buckets)
	if c.Wait == 0 {
		c.Wait = DefaultWatchWait
	}
	if c.Checks == 0 {
		c.Checks = DefaultWatchChecks
	}
	if c.Checks < 2 {
		return errors.New("verify: a difference is named when two comparisons in a row find it: checks must be at least 2")
	}
	if c.Poll == 0 {
		c.Poll = DefaultWatchPoll
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Interval is the time between two steps' starts.
func (c WatchConfig) Interval() time.Duration {
	return c.Pass * time.Duration(c.Step) / time.Duration(c.Buckets)
}

// Watcher verifies projections continuously: it walks the buckets Step at
// a time, one step every [WatchConfig.Interval], and for each store
//
//  1. reads the step's bucket digests from Postgres in one snapshot, and
//     the WAL position after it;
//  2. waits until the store's projection has passed that position
//     ([Progress]), then reads the store's digests of the same buckets: a
//     write committed before the position is in both, so that no write in
//     flight then is taken for a difference; an equal digest proves the
//     bucket in agreement as of the Postgres read;
//  3. compares the documents of each bucket that differs the same way
//     (Postgres read at a position, the store read once it was passed),
//     up to Checks times in a row, and names a difference when two
//     comparisons in a row find it with Postgres's document unchanged
//     between them. A write after the first read that the store applied
//     before its read shows as the store ahead of Postgres's read; it was
//     committed before the second read, which then sees another document:
//     so a write in flight is never named, and a difference named is one
//     the store held once it had every event before the first read. A
//     store ahead whose document Postgres holds as the store does when
//     asked again is no difference (see catchUp).
//
// With a Reemitter, a difference named that a re-emission repairs is
// re-emitted through the writer once, and compared again after the
// projection passed the re-emission. Named differences stay named until a
// comparison of their bucket finds them gone.
type Watcher struct {
	cfg      WatchConfig
	truth    PositionedTruth
	stores   []Projection
	progress Progress
	started  time.Time

	mu    sync.Mutex
	state map[string]*storeState
}

// storeState is what the watcher knows of one store.
type storeState struct {
	kind         Kind
	buckets      []bucketState
	named        map[string]*NamedDifference
	unsettled    map[int]bool
	lastFullPass time.Time
	passes       int
	passClean    bool // every bucket of the current pass compared
}

// bucketState is a bucket's last comparison.
type bucketState struct {
	agrees   bool
	provenAt time.Time // the Postgres read the agreement was proven at
	docs     int       // Postgres's documents in it then
}

// NewWatcher watches stores against truth, with the projections' progress
// told by progress.
func NewWatcher(truth PositionedTruth, stores []Projection, progress Progress, cfg WatchConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(stores) == 0 {
		return nil, errors.New("verify: no store to watch")
	}
	w := &Watcher{cfg: cfg, truth: truth, stores: stores, progress: progress, state: map[string]*storeState{}}
	for _, p := range stores {
		w.state[p.Side.Name()] = &storeState{kind: p.Kind, buckets: make([]bucketState, cfg.Buckets),
			named: map[string]*NamedDifference{}, unsettled: map[int]bool{}, passClean: true}
	}
	if m := cfg.Metrics; m != nil {
		m.PassTarget.Set(cfg.Pass.Seconds())
		for _, p := range stores {
			name := p.Side.Name()
			// Every counter's series exists from the start, at 0, so
			// that an alert on its increase sees the first one.
			m.Passes.WithLabelValues(name)
			m.Named.WithLabelValues(name)
			m.Errors.WithLabelValues(name)
			m.Behind.WithLabelValues(name)
			for _, r := range []string{"agree", "differ"} {
				m.Compared.WithLabelValues(name, r)
			}
			for _, o := range []string{"reemitted", "repaired", "unrepairable"} {
				m.Repairs.WithLabelValues(name, o)
			}
			w.publish(name)
		}
	}
	return w, nil
}

// Run walks the buckets until ctx ends, and returns nil then. A side that
// fails is logged and counted, and its buckets of the step stay as they
// were; the walk goes on.
func (w *Watcher) Run(ctx context.Context) error {
	w.mu.Lock()
	w.started = time.Now()
	w.mu.Unlock()
	interval := w.cfg.Interval()
	next := time.Now()
	for cursor := 0; ; {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		start := time.Now()
		hi := min(cursor+w.cfg.Step, w.cfg.Buckets)
		step := make([]int, 0, hi-cursor)
		for b := cursor; b < hi; b++ {
			step = append(step, b)
		}
		var wg sync.WaitGroup
		for _, p := range w.stores {
			wg.Go(func() { w.step(ctx, p, step) })
		}
		wg.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if cursor = hi; cursor == w.cfg.Buckets {
			w.endPass(time.Now())
			cursor = 0
		}
		next = start.Add(interval)
	}
}

// step compares buckets of one store.
func (w *Watcher) step(ctx context.Context, p Projection, buckets []int) {
	name, n := p.Side.Name(), w.cfg.Buckets
	want, pos, err := w.truth.DigestsAt(ctx, p.Kind, n, buckets)
	at := time.Now()
	if err != nil {
		w.failed(ctx, name, w.truth.Name(), err)
		return
	}
	if !w.waitPassed(ctx, name, pos) {
		return
	}
	got, err := DigestsOf(ctx, p.Side, p.Kind, n, buckets)
	if err != nil {
		w.failed(ctx, name, name, err)
		return
	}
	var differ []int
	for _, b := range buckets {
		if want[b] == got[b] {
			w.agree(name, b, at, want[b].Docs)
		} else {
			differ = append(differ, b)
		}
	}
	if m := w.cfg.Metrics; m != nil {
		m.Compared.WithLabelValues(name, "agree").Add(float64(len(buckets) - len(differ)))
		m.Compared.WithLabelValues(name, "differ").Add(float64(len(differ)))
	}
	if len(differ) > 0 {
		w.settle(ctx, p, differ)
	}
	w.publish(name)
	w.cfg.Log.Debug("step compared", "store", name, "from", buckets[0], "buckets", len(buckets), "differing", len(differ),
		"position", pos.String(), "took", time.Since(at).Round(time.Millisecond).String())
}

// seen is a difference as one comparison found it: its problem and
// Postgres's document then (the SHA-256 of its line, zero when Postgres
// had none).
type seen struct {
	problem string
	truth   [32]byte
}

func seenOf(kind Kind, d Difference) seen {
	s := seen{problem: d.Problem}
	if d.Expected != nil {
		s.truth = sha256.Sum256([]byte(d.Expected.Line(kind)))
	}
	return s
}

// settle compares the documents of buckets whose digests differed, until
// each bucket agrees or has every difference named, at most Checks times
// (and once more after a re-emission).
func (w *Watcher) settle(ctx context.Context, p Projection, buckets []int) {
	name, n := p.Side.Name(), w.cfg.Buckets
	prev := map[string]seen{}
	checks, reemitted := w.cfg.Checks, false
	for i := 0; i < checks && len(buckets) > 0; i++ {
		want, pos, err := w.truth.BucketsAt(ctx, p.Kind, n, buckets)
		at := time.Now()
		if err != nil {
			w.failed(ctx, name, w.truth.Name(), err)
			return
		}
		if !w.waitPassed(ctx, name, pos) {
			return
		}
		got, err := p.Side.Buckets(ctx, p.Kind, n, buckets)
		if err != nil {
			w.failed(ctx, name, name, err)
			return
		}
		byBucket := make(map[int][]Difference, len(buckets))
		for _, b := range buckets {
			byBucket[b] = diffBucket(p.Kind, want[b], got[b])
		}
		if err := w.catchUp(ctx, p, byBucket); err != nil {
			w.failed(ctx, name, w.truth.Name(), err)
			return
		}
		cur := map[string]seen{}
		var open []int
		var repair []string
		for _, b := range buckets {
			diffs := byBucket[b]
			if len(diffs) == 0 {
				w.agree(name, b, at, len(want[b]))
				continue
			}
			settled, moving := true, true
			for _, d := range diffs {
				s := seenOf(p.Kind, d)
				cur[d.Key] = s
				if prev[d.Key] != s {
					settled = false
					// Postgres's document changed since the last check: a
					// write in flight, which the next check most likely
					// finds in flight again.
					moving = moving && i > 0 && prev[d.Key].problem != "" && prev[d.Key].truth != s.truth
					continue
				}
				if w.name(name, p.Kind, b, d, at) {
					repair = append(repair, d.Key)
				}
			}
			w.differs(name, b, diffs, !settled)
			if !settled && !moving {
				open = append(open, b)
			}
		}
		w.cfg.Log.Debug("documents compared", "store", name, "check", i+1, "buckets", len(buckets), "unsettled", len(open),
			"position", pos.String(), "took", time.Since(at).Round(time.Millisecond).String())
		prev = cur
		if len(repair) > 0 && !reemitted {
			reemitted = true
			w.reemit(ctx, name, repair)
			checks++ // to see the re-emission applied
			for _, k := range repair {
				if b := Bucket(k, n); !slices.Contains(open, b) {
					open = append(open, b)
				}
			}
		}
		buckets = open
	}
}

// ahead reports whether d shows the store ahead of Postgres's read: a
// version newer than Postgres's, or a document Postgres did not have.
func ahead(d Difference) bool { return d.Problem == VersionMismatch || d.Problem == Extra }

// catchUp drops from diffs (by bucket) each difference that shows the
// store ahead of Postgres's read whose document Postgres holds now, as the
// store held it: a write committed after Postgres was read, which the
// store applied before it was read, and which agrees. The document is
// then proven in agreement as of the store's read, after the bucket's
// other documents were (at the Postgres read), so that a bucket being
// written can be proven whole.
func (w *Watcher) catchUp(ctx context.Context, p Projection, diffs map[int][]Difference) error {
	var buckets []int
	for b, ds := range diffs {
		if slices.ContainsFunc(ds, ahead) {
			buckets = append(buckets, b)
		}
	}
	if len(buckets) == 0 {
		return nil
	}
	slices.Sort(buckets)
	now, _, err := w.truth.BucketsAt(ctx, p.Kind, w.cfg.Buckets, buckets)
	if err != nil {
		return err
	}
	for _, b := range buckets {
		held := make(map[string]Doc, len(now[b]))
		for _, d := range now[b] {
			held[d.Key] = d
		}
		diffs[b] = slices.DeleteFunc(diffs[b], func(d Difference) bool {
			pg, ok := held[d.Key]
			if !ahead(d) || !ok || d.Actual == nil {
				return false
			}
			_, differs := diffDoc(p.Kind, pg, *d.Actual)
			return !differs
		})
	}
	return nil
}

// waitPassed waits until store's projection passed pos, at most Wait; it
// reports whether it did.
func (w *Watcher) waitPassed(ctx context.Context, store string, pos Position) bool {
	start := time.Now()
	deadline := start.Add(w.cfg.Wait)
	var last error
	for {
		ok, err := w.progress.Passed(ctx, store, pos)
		if ok {
			if m := w.cfg.Metrics; m != nil {
				m.ProjectionWait.WithLabelValues(store).Observe(time.Since(start).Seconds())
			}
			return true
		}
		last = err
		if ctx.Err() != nil {
			return false
		}
		if time.Now().After(deadline) {
			break
		}
		t := time.NewTimer(w.cfg.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	w.mu.Lock()
	w.state[store].passClean = false
	w.mu.Unlock()
	if m := w.cfg.Metrics; m != nil {
		m.Behind.WithLabelValues(store).Inc()
	}
	if last != nil {
		w.failed(ctx, store, "progress", last)
	} else {
		w.cfg.Log.Warn("the projection did not pass the position Postgres was read at in time: the step's buckets stay unproven",
			"store", store, "position", pos.String(), "waited", w.cfg.Wait)
	}
	return false
}

// failed notes that a side could not be read.
func (w *Watcher) failed(ctx context.Context, store, side string, err error) {
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	w.state[store].passClean = false
	w.mu.Unlock()
	if m := w.cfg.Metrics; m != nil {
		m.Errors.WithLabelValues(store).Inc()
	}
	w.cfg.Log.Error("a step of the watch failed: its buckets stay as they were", "store", store, "side", side, "err", err)
}

// agree records bucket b of store proven in agreement as of at, and every
// difference named in it gone.
func (w *Watcher) agree(store string, b int, at time.Time, docs int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[store]
	st.buckets[b] = bucketState{agrees: true, provenAt: at, docs: docs}
	delete(st.unsettled, b)
	for key, d := range st.named {
		if d.Bucket == b {
			w.gone(store, st, key, d)
		}
	}
}

// differs records bucket b of store found differing by diffs; unsettled:
// some of them are not named yet.
func (w *Watcher) differs(store string, b int, diffs []Difference, unsettled bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[store]
	st.buckets[b] = bucketState{}
	if unsettled {
		st.unsettled[b] = true
	} else {
		delete(st.unsettled, b)
	}
	for key, d := range st.named {
		if d.Bucket == b && !slices.ContainsFunc(diffs, func(x Difference) bool { return x.Key == key }) {
			w.gone(store, st, key, d)
		}
	}
}

// gone drops a named difference that a comparison no longer finds.
func (w *Watcher) gone(store string, st *storeState, key string, d *NamedDifference) {
	delete(st.named, key)
	if d.Reemitted != nil {
		w.cfg.Log.Info("repaired: a difference named is gone after its re-emission", "store", store, "key", key, "problem", d.Problem)
		if m := w.cfg.Metrics; m != nil {
			m.Repairs.WithLabelValues(store, "repaired").Inc()
		}
		return
	}
	w.cfg.Log.Info("a difference named is gone", "store", store, "key", key, "problem", d.Problem)
}

// name records d, found twice in a row in bucket b of store, as named. It
// reports whether it is to be re-emitted now: named for the first time (or
// with another problem), repairable, and repairs on.
func (w *Watcher) name(store string, kind Kind, b int, d Difference, at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[store]
	item := RepairItem{Store: store, Kind: kind, Key: d.Key, Problem: d.Problem, Detail: d.Detail}
	if old, ok := st.named[d.Key]; ok && old.Problem == d.Problem {
		old.LastSeen, old.Detail = at, d.Detail
		// A re-emission that failed is tried again; one that was applied
		// and left the difference is not: the difference is reported.
		return w.cfg.Reemitter != nil && old.Repairable && old.Reemitted == nil
	}
	nd := &NamedDifference{Store: store, Key: d.Key, Bucket: b, Problem: d.Problem, Detail: d.Detail, NamedAt: at, LastSeen: at,
		Repairable: item.Repairable()}
	st.named[d.Key] = nd
	w.cfg.Log.Warn("difference: the store disagrees with Postgres after it passed Postgres's position, twice in a row",
		"store", store, "key", d.Key, "problem", d.Problem, "detail", d.Detail, "bucket", b, "repairable", nd.Repairable)
	m := w.cfg.Metrics
	if m != nil {
		m.Named.WithLabelValues(store).Inc()
	}
	if w.cfg.Reemitter == nil {
		return false
	}
	if !nd.Repairable {
		nd.Unrepairable = item.UnrepairableReason()
		w.cfg.Log.Error("a difference named cannot be repaired by re-emission", "store", store, "key", d.Key, "problem", d.Problem,
			"reason", nd.Unrepairable)
		if m != nil {
			m.Repairs.WithLabelValues(store, "unrepairable").Inc()
		}
		return false
	}
	return true
}

// reemit re-emits keys, named differences of store, through the writer.
func (w *Watcher) reemit(ctx context.Context, store string, keys []string) {
	slices.Sort(keys)
	res, err := w.cfg.Reemitter.ReemitKeys(ctx, keys)
	now := time.Now()
	w.mu.Lock()
	st := w.state[store]
	for _, r := range res.Reemitted {
		if d, ok := st.named[r.Key]; ok {
			d.Reemitted = &now
		}
	}
	for _, k := range res.NotFound {
		if d, ok := st.named[k]; ok {
			d.RepairError = "Postgres no longer has the document"
		}
	}
	if err != nil {
		for _, k := range keys {
			if d, ok := st.named[k]; ok && d.Reemitted == nil {
				d.RepairError = err.Error()
			}
		}
	}
	w.mu.Unlock()
	if m := w.cfg.Metrics; m != nil {
		m.Repairs.WithLabelValues(store, "reemitted").Add(float64(len(res.Reemitted)))
	}
	if err != nil {
		w.cfg.Log.Error("re-emitting differences named failed", "store", store, "keys", keys, "err", err)
		return
	}
	w.cfg.Log.Info("re-emitted differences named", "store", store, "keys", keys, "not_found", res.NotFound)
}

// endPass ends a walk over every bucket at now.
func (w *Watcher) endPass(now time.Time) {
	w.mu.Lock()
	var names []string
	for name, st := range w.state {
		if st.passClean {
			st.lastFullPass = now
			st.passes++
			if m := w.cfg.Metrics; m != nil {
				m.Passes.WithLabelValues(name).Inc()
			}
		}
		st.passClean = true
		names = append(names, name)
	}
	w.mu.Unlock()
	for _, name := range names {
		w.publish(name)
	}
}
