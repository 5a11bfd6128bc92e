// Package lease makes one instance of a service the only writer of its
// store while others stand by: a lease in a NATS key-value bucket
// (CONVERGE_LEASES), one key per service name, held by renewing it with a
// compare-and-set of its revision.
//
// The rule of time that makes it sound without synchronised clocks:
//
//   - A holder renews every TTL/3. Its term is valid until the moment it
//     sent the last successful renewal plus Validity (TTL less a margin),
//     measured on its own monotonic clock. A holder writes only while its
//     term is valid; once it is not, a write waits for the next renewal,
//     and a renewal that finds another revision ends the term for good.
//   - A standby takes the key over only once it has seen the same revision
//     for a whole TTL on its own clock, and then only with a
//     compare-and-set of that revision. It first saw that revision after
//     the holder sent the renewal that made it, so the holder's term
//     ended at least TTL-Validity before: never two valid terms at once.
//   - A holder that stops cleanly deletes the key (compare-and-set too),
//     and a standby takes it at once.
//
// A restarted instance (the same Config.Holder, another run) takes the key
// at once when the run holding it is provably gone: a process of the same
// kernel boot and pid namespace whose pid no longer exists (a supervisor
// restarted a process it killed). Anything else, two live instances that
// share a name (pods with one fixed hostname, cloned VMs, two processes
// with one metrics address) included, waits for a whole TTL without
// renewal like any standby, so two of them never take the key from each
// other.
//
// A process paused (SIGSTOP, a long GC, a frozen VM) finds on waking that
// its term is past its validity; it writes nothing until a renewal
// succeeds, which it cannot once another instance has taken the key.
// What the lease cannot fence is a write already sent when the pause
// began: the stores' version guards make that one harmless.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/sharedkv"
)

// Bucket is the key-value bucket of the leases.
const Bucket = "CONVERGE_LEASES"

// BucketConfig is the leases' bucket's settings, with replicas.
func BucketConfig(replicas int) sharedkv.Config {
	return sharedkv.Config{Bucket: Bucket, Description: "converge: which instance of each service writes its store",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas}
}

// DefaultTTL is how long a lease outlives its holder's last renewal.
const DefaultTTL = 3 * time.Second

// ErrLost is the end of a term: another instance holds the lease now.
var ErrLost = errors.New("lease: another instance took the lease; this one stands by")

// ErrExpired ends a call bound to a term ([Term.Bound]) whose validity
// ran out before a renewal succeeded: NATS unreachable or this process
// paused, while a standby may be taking over.
var ErrExpired = errors.New("lease: the term's validity ran out before a renewal succeeded (NATS unreachable, or this process paused); the call was cut off")

// Config of a lease.
type Config struct {
	// Name is the lease's key: the service it makes single-writer (a
	// projector's or the notifier's durable consumer name). Required.
	Name string
	// Holder names this instance for people: the same across its
	// restarts (a host and an address). A process that finds the lease
	// held by an earlier run of its own Holder takes it at once only when
	// that run's process is provably gone (see the package doc). Default
	// host-pid.
	Holder string
	// incarnation tells this run from every other run; self is its
	// process.
	incarnation string
	self        process
	// TTL is how long a standby waits for a renewal before it takes over;
	// default DefaultTTL. Renewals are every TTL/3.
	TTL time.Duration
	// Replicas of the bucket (a NATS cluster); default 1.
	Replicas int
	// Poll is how often a standby reads the key; default TTL/6.
	Poll time.Duration
	// Clock is the wall clock of the times in the value (Since,
	// Renewed), which are for people: no decision reads them. Nil:
	// clock.Wall().
	Clock clock.Clock
	// Want, when set, is asked before every taking: while it says no,
	// Acquire takes nothing but keeps following the key, so that once it
	// says yes a lease its holder stopped renewing a TTL ago is taken at
	// once (a partition another instance should hold, see [Members]).
	Want func() bool
}

func (c *Config) setDefaults() error {
	if c.Name == "" {
		return errors.New("lease: a name is required")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	c.incarnation = fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	c.self = thisProcess()
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.Replicas <= 0 {
		c.Replicas = config.DefaultReplicas
	}
	if c.Poll <= 0 {
		c.Poll = c.TTL / 6
	}
	if c.Clock == nil {
		c.Clock = clock.Wall()
	}
	return nil
}

// Validity is how long after sending a renewal its holder may write: the
// TTL less a fifth, for the two clocks' rates and the scheduler.
func (c Config) Validity() time.Duration { return c.TTL - c.TTL/5 }

// Value is what the key holds. Its times are the holder's wall clock's
// (Config.Clock), for people: the rule of time reads none of them.
type Value struct {
	Holder      string    `json:"holder"`
	Incarnation string    `json:"incarnation,omitempty"`
	Since       time.Time `json:"since"` // when this holder took the lease
	Renewed     time.Time `json:"renewed"`
	TTLms       int64     `json:"ttl_ms"`
	// The holder's process: its kernel's boot id, pid namespace and pid.
	Boot  string `json:"boot,omitempty"`
	PIDNS string `json:"pid_ns,omitempty"`
	PID   int    `json:"pid,omitempty"`
}

// process is the holder's process in a Value.
func (v Value) process() process { return process{Boot: v.Boot, PIDNS: v.PIDNS, PID: v.PID} }

// Lease is one service's lease, as seen by this instance.
type Lease struct {
	cfg Config
	kv  jetstream.KeyValue
	log *slog.Logger
	// beforeRenew, in tests, runs before each renewal: blocking it is a
	// holder whose process is paused.
	beforeRenew func()
}

// Open ensures the bucket (created, never updated: every service shares
// it, see internal/sharedkv) and returns the lease of cfg.Name.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (*Lease, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kv, refusesRollups, err := sharedkv.Open(ctx, js, BucketConfig(cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if !refusesRollups {
		log.Warn("the leases' bucket allows roll-ups, by which any holder of one lease can delete every other; run `converge streams apply` as the operator",
			"bucket", Bucket)
	}
	return &Lease{cfg: cfg, kv: kv, log: log.With("lease", cfg.Name, "holder", cfg.Holder)}, nil
}

// Config is the lease's configuration, defaults applied.
func (l *Lease) Config() Config { return l.cfg }

// Current reads who holds the lease (ok false: nobody).
func (l *Lease) Current(ctx context.Context) (Value, uint64, bool, error) {
	return Read(ctx, l.kv, l.cfg.Name)
}

// Read reads the lease called key in kv, the leases' bucket, and its
// revision; ok false when nobody holds it.
func Read(ctx context.Context, kv jetstream.KeyValue, key string) (v Value, rev uint64, ok bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Value{}, 0, false, nil
	}
	if err != nil {
		return Value{}, 0, false, err
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return Value{}, e.Revision(), true, fmt.Errorf("lease %s: unreadable value: %w", key, err)
	}
	return v, e.Revision(), true, nil
}

// Acquire waits until this instance holds the lease, or ctx ends. The
// term it returns is renewed until Release or until it is lost. standby
// is called once when the lease is found held by another instance.
func (l *Lease) Acquire(ctx context.Context, standby func(holder Value)) (*Term, error) {
	var seenRev uint64
	var seenAt time.Time
	told := false
	for {
		sent := time.Now()
		v, rev, held, err := l.Current(ctx)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil && rev == 0:
			l.log.Warn("reading the lease failed; trying again", "err", err)
		case !held:
			// Free (never taken, or released): Create is a compare-and-set
			// on the key's absence or its delete marker.
			seenRev = 0
			if !l.wanted() {
				break
			}
			if t, err := l.take(ctx, sent, 0); err == nil {
				return t, nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				l.log.Warn("taking the lease failed; trying again", "err", err)
			}
		default:
			if v.Holder == l.cfg.Holder && v.Incarnation != l.cfg.incarnation && v.process().gone(l.cfg.self) && l.wanted() {
				// An earlier run of this instance, whose process has ended.
				if t, err := l.take(ctx, sent, rev); err == nil {
					l.log.Info("took the lease over from an earlier run of this instance", "previous", v.Incarnation, "previous_pid", v.PID)
					return t, nil
				}
				break
			}
			if rev != seenRev {
				seenRev, seenAt = rev, time.Now()
				if !told && standby != nil {
					standby(v)
					told = true
				}
				break
			}
			if time.Since(seenAt) < l.cfg.TTL || !l.wanted() {
				break
			}
			// No renewal for a whole TTL: the holder's term is over.
			t, err := l.take(ctx, sent, rev)
			if err == nil {
				l.log.Warn("took over the lease: its holder stopped renewing it", "previous", v.Holder,
					"renewed", v.Renewed, "silent_for", time.Since(seenAt).Round(time.Millisecond))
				return t, nil
			}
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
				l.log.Warn("taking the lease over failed; trying again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(l.cfg.Poll):
		}
	}
}

// wanted is Config.Want's answer (yes without one).
func (l *Lease) wanted() bool { return l.cfg.Want == nil || l.cfg.Want() }

// value is what this instance writes in the key.
func (l *Lease) value(since, renewed time.Time) Value {
	p := l.cfg.self
	return Value{Holder: l.cfg.Holder, Incarnation: l.cfg.incarnation, Since: since, Renewed: renewed, TTLms: l.cfg.TTL.Milliseconds(),
		Boot: p.Boot, PIDNS: p.PIDNS, PID: p.PID}
}

// take writes this instance's value over revision rev (0: the key is
// absent or deleted).
func (l *Lease) take(ctx context.Context, sent time.Time, rev uint64) (*Term, error) {
	now := l.cfg.Clock.Now().UTC()
	b, _ := json.Marshal(l.value(now, now))
	var err error
	var got uint64
	if rev == 0 {
		got, err = l.kv.Create(ctx, l.cfg.Name, b)
	} else {
		got, err = l.kv.Update(ctx, l.cfg.Name, b, rev)
	}
	if err != nil {
		return nil, err
	}
	t := &Term{lease: l, since: now, rev: got, validUntil: sent.Add(l.cfg.Validity()), lost: make(chan struct{}), renewed: make(chan struct{})}
	t.epoch = got
	ctx, t.stop = context.WithCancel(context.WithoutCancel(ctx))
	t.done = make(chan struct{})
	go t.renew(ctx)
	return t, nil
}

// Term is one holding of the lease, from its taking to its release or
// loss.
type Term struct {
	lease *Lease
	since time.Time
	epoch uint64 // the revision that took the lease: greater for every later term

	mu         sync.Mutex
	rev        uint64
	validUntil time.Time     // monotonic
	renewed    chan struct{} // closed and replaced at every successful renewal
	lost       chan struct{} // closed once the lease is lost
	lostOnce   sync.Once
	stop       context.CancelFunc
	done       chan struct{}
}

// Epoch identifies the term: the key's revision when this instance took
// it, greater than any earlier term's.
func (t *Term) Epoch() uint64 { return t.epoch }

// Lost is closed once another instance holds the lease.
func (t *Term) Lost() <-chan struct{} { return t.lost }

// Valid reports whether the holder may write now.
func (t *Term) Valid() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Now().Before(t.validUntil) && !t.isLost()
}

func (t *Term) isLost() bool {
	select {
	case <-t.lost:
		return true
	default:
		return false
	}
}

// Check returns nil while the term is valid. Past its validity (the
// renewals failed, or this process was paused) it waits for the next
// renewal, until ctx ends: ErrLost when the renewal found the lease taken.
func (t *Term) Check(ctx context.Context) error {
	for {
		t.mu.Lock()
		valid, renewed := time.Now().Before(t.validUntil), t.renewed
		t.mu.Unlock()
		if t.isLost() {
			return ErrLost
		}
		if valid {
			return nil
		}
		select {
		case <-t.lost:
			return ErrLost
		case <-renewed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Bound returns a context for one store call made now: it ends, with
// cause [ErrLost] or [ErrExpired], as soon as the term is lost or its
// validity runs out without a renewal, so that a call cannot outlast the
// term it started in (a writer cut off from NATS stops writing by the
// time a standby may take over). A request already sent when it ends may
// still land: the stores' version guards make that one harmless.
func (t *Term) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	bound, cancel := context.WithCancelCause(ctx)
	go func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			t.mu.Lock()
			until := t.validUntil
			t.mu.Unlock()
			left := time.Until(until)
			if left <= 0 {
				cancel(ErrExpired)
				return
			}
			timer.Reset(left)
			select {
			case <-bound.Done():
				return
			case <-t.lost:
				cancel(ErrLost)
				return
			case <-timer.C:
			}
		}
	}()
	return bound, func() { cancel(context.Canceled) }
}

func (t *Term) markLost() { t.lostOnce.Do(func() { close(t.lost) }) }

// renew renews the lease every TTL/3 until stopped or lost.
func (t *Term) renew(ctx context.Context) {
	defer close(t.done)
	l := t.lease
	every := l.cfg.TTL / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if l.beforeRenew != nil {
			l.beforeRenew()
		}
		t.mu.Lock()
		rev := t.rev
		t.mu.Unlock()
		sent := time.Now()
		b, _ := json.Marshal(l.value(t.since, l.cfg.Clock.Now().UTC()))
		rctx, cancel := context.WithTimeout(ctx, every)
		got, err := l.kv.Update(rctx, l.cfg.Name, b, rev)
		cancel()
		switch {
		case err == nil:
			t.mu.Lock()
			t.rev, t.validUntil = got, sent.Add(l.cfg.Validity())
			close(t.renewed)
			t.renewed = make(chan struct{})
			t.mu.Unlock()
			timer.Reset(every)
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
			errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			// A renewal whose answer was lost (a stream leader change) may
			// have been stored: the key then holds this very run.
			if v, rev, held, gerr := l.Current(ctx); gerr == nil && held && v.Holder == l.cfg.Holder && v.Incarnation == l.cfg.incarnation {
				t.mu.Lock()
				t.rev = rev
				t.mu.Unlock()
				timer.Reset(0)
				continue
			}
			l.log.Error("the lease was taken by another instance; this one stops writing", "err", err)
			t.markLost()
			return
		case ctx.Err() != nil:
			return
		default:
			l.log.Warn("renewing the lease failed; writes wait until a renewal succeeds", "err", err,
				"valid_for", time.Until(t.validUntilNow()).Round(time.Millisecond))
			timer.Reset(min(every, 200*time.Millisecond))
		}
	}
}

func (t *Term) validUntilNow() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.validUntil
}

// Release stops renewing and, unless the lease was lost, deletes the key so
// that a standby takes over at once.
func (t *Term) Release() {
	t.stop()
	<-t.done
	if t.isLost() {
		return
	}
	t.mu.Lock()
	rev := t.rev
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := t.lease.kv.Delete(ctx, t.lease.cfg.Name, jetstream.LastRevision(rev)); err != nil {
		t.lease.log.Warn("releasing the lease failed; a standby takes it over once it expires", "err", err)
	}
	t.markLost()
}
