// Package rebuild rebuilds a projection from scratch inside its projector
// process, while live traffic continues.
//
// A store that can hold two copies of the projection (the embedded index
// and graph: directories; Qdrant: collections behind an alias) is rebuilt
// blue/green (its stores are [BlueGreen]):
//
//  1. a fresh generation is created and filled from the stream's first
//     message by a second runtime on its own durable consumer,
//     <projector>-rebuild, while the live runtime keeps the live generation
//     current and serves reads from it;
//  2. once the rebuild has caught up, the live runtime's writes are held
//     back, the rebuild catches up once more (so the fresh generation holds
//     every event the live one holds), and the fresh generation is made
//     live in one step (a pointer file renamed into place, a Qdrant alias
//     switch) and swapped in under the live runtime, which resumes from its
//     own position on it;
//  3. the previous generation is dropped and the rebuild consumer deleted.
//
// A store that holds a single copy (Neo4j Community has one database) is
// rebuilt in place (its stores are [InPlace]): the live runtime's writes
// are held back, the projection is wiped, and the rebuild runtime fills it
// from the stream's first message; reads see a partial graph until it has
// caught up.
//
// Each store has one writer at every moment: the rebuild runtime writes
// only to the fresh generation until the swap, and to an in-place store
// only while the live runtime is held back.
//
// A projector running in partitions has its live writers in several
// processes: one of them runs its rebuilds (the holder of the lease
// <name>.rebuild, see projector.CoordinatorLease), and takes every
// partition (projector.Exclusive) before it holds the live writes back;
// the others reopen the live generation when they take a partition again.
//
// The rebuild's state (its phase, the fresh and the previous generation) is
// kept in the JetStream key-value bucket CONVERGE_REBUILDS, under the
// projector's name, before any step that depends on it, so a projector
// process that crashes during a rebuild resumes it when it starts again.
package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/retry"
	"github.com/converge-sync/converge/internal/sharedkv"

	"github.com/converge-sync/converge/pkg/contract"
)

// Bucket is the key-value bucket holding the state of rebuilds in progress.
const Bucket = "CONVERGE_REBUILDS"

// BucketConfig is the rebuilds' bucket's settings, with replicas.
func BucketConfig(replicas int) sharedkv.Config {
	return sharedkv.Config{Bucket: Bucket, Description: "converge: rebuilds in progress, by projector",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas}
}

// Stores are the generations of one projection's store, as both ways of
// rebuilding it see them. A Manager takes stores that are also exactly
// one of [BlueGreen] and [InPlace], and rebuilds them that way.
type Stores interface {
	// Live names the live generation.
	Live(ctx context.Context) (string, error)
	// Open opens the generation called name, creating it if it is missing.
	Open(ctx context.Context, name string) (*Generation, error)
	// Describe names a generation for logs and reports.
	Describe(name string) string
}

// BlueGreen are stores that hold several generations: a rebuild fills a
// fresh one, makes it live in one step, and drops the previous one.
type BlueGreen interface {
	Stores
	// Fresh names a new generation, distinct from every existing one.
	Fresh() string
	// Activate makes the generation called name the live one, in one step
	// that readers and a restarted projector both see; it is idempotent.
	Activate(ctx context.Context, name string) error
	// Drop deletes the generation called name, which is not live; one that
	// does not exist is already dropped.
	Drop(ctx context.Context, name string) error
}

// InPlace are stores that hold a single generation, the live one: a
// rebuild wipes it and fills it again.
type InPlace interface {
	Stores
	// Wipe deletes the whole projection from g, the live generation.
	Wipe(ctx context.Context, g *Generation) error
}

// PartitionWiper are stores whose live generation can lose the documents
// of one partition alone. A rebuild of one partition (a projector in
// partitions, [Manager.StartPartition]) wipes them and fills them again
// from the partition's events in the partitioned stream: in place on the
// live generation, whichever way the stores rebuild the whole, since one
// generation holds every partition.
type PartitionWiper interface {
	// WipePartition deletes from g, the live generation, everything it
	// holds of the documents of partition part of n
	// ([contract.Partition] of their keys), their version markers
	// included, and leaves the other documents as they are.
	WipePartition(ctx context.Context, g *Generation, part, n int) error
	// PartitionRefused is why no partition of g can be rebuilt alone now
	// (the index refusing writes: its vectors are another embedder's,
	// which a whole rebuild replaces); nil: one can.
	PartitionRefused(g *Generation) error
}

// ErrInvalid is the error of a rebuild asked for with what cannot be
// rebuilt (a partition the projector does not have); Start's other errors
// are the rebuild's being unavailable for now.
var ErrInvalid = errors.New("rebuild: invalid request")

// isInPlace reports whether stores are rebuilt in place; an error when they
// are not exactly one of BlueGreen and InPlace.
func isInPlace(stores Stores) (bool, error) {
	_, bg := stores.(BlueGreen)
	_, ip := stores.(InPlace)
	switch {
	case bg && ip:
		return false, fmt.Errorf("rebuild: stores %T are both blue/green and in place", stores)
	case !bg && !ip:
		return false, fmt.Errorf("rebuild: stores %T are neither blue/green nor in place", stores)
	}
	return ip, nil
}

// Phases of a rebuild, as kept in its state and reported by Status.
const (
	PhaseStarting  = "starting"  // the process is connecting to NATS
	PhaseIdle      = "idle"      // no rebuild in progress, none since the process started
	PhaseWiping    = "wiping"    // in place: deleting the projection
	PhaseFilling   = "filling"   // applying the stream from its start
	PhaseSwitching = "switching" // live writes held back: last catch-up, then the swap
	PhaseDone      = "done"
	PhaseRetrying  = "retrying" // a step failed; it is tried again
)

// State is a rebuild in progress as its bucket keeps it, under the
// projector's name: what survives a crash.
type State struct {
	Projector string `json:"projector,omitempty"`
	ID        string `json:"id"`
	Phase     string `json:"phase"`
	InPlace   bool   `json:"in_place"` // begun on [InPlace] stores: Target is the live generation, wiped
	Target    string `json:"target"`   // the generation being filled
	Previous  string `json:"previous"` // the live generation when the rebuild began
	// Superseded are other generations the live runtime was found on at
	// the switch, dropped with Previous: one opened by a restart while no
	// generation was live (a crash between dropping a legacy Qdrant
	// collection and creating its alias).
	Superseded []string  `json:"superseded,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	// Partition, when set, is the one partition of Partitions being
	// rebuilt: in place on the live generation (InPlace; Target is the
	// live generation), from the partitioned stream.
	Partition  *int `json:"partition,omitempty"`
	Partitions int  `json:"partitions,omitempty"`
	// Widened is why a rebuild begun of one partition became one of the
	// whole store (it could no longer be done as begun).
	Widened string `json:"widened,omitempty"`
	// DoneAt is set once the rebuild ended (Phase done): the state stays,
	// for every instance to report, until the next rebuild replaces it.
	// Abandoned is then why a partition's rebuild ended unfinished.
	DoneAt    *time.Time `json:"done_at,omitempty"`
	Abandoned string     `json:"abandoned,omitempty"`
}

// running reports whether st is a rebuild still to carry out.
func (st *State) running() bool { return st != nil && st.Phase != PhaseDone }

// Status reports the rebuild in progress, or the last one.
type Status struct {
	Projector string `json:"projector"`
	ID        string `json:"id,omitempty"`
	Phase     string `json:"phase"`
	InPlace   bool   `json:"in_place"`
	Target    string `json:"target,omitempty"`
	Previous  string `json:"previous,omitempty"`
	// Partition is the one partition of Partitions rebuilt; absent for a
	// rebuild of the whole store.
	Partition  *int       `json:"partition,omitempty"`
	Partitions int        `json:"partitions,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	DoneAt     *time.Time `json:"done_at,omitempty"`
	// StreamLastSeq is the stream's last sequence (of a partition: the
	// partitioned stream's last of that partition) and AppliedSeq the
	// rebuild consumer's acknowledgement floor, when Status was called;
	// Pending is what the rebuild has still to apply.
	StreamLastSeq uint64 `json:"stream_last_seq"`
	AppliedSeq    uint64 `json:"applied_seq"`
	Pending       uint64 `json:"pending"`
	Error         string `json:"error,omitempty"`
	// Abandoned, with the phase done, is why the rebuild of one partition
	// was ended unfinished (the partitions were made anew), and what its
	// documents then hold. Widened is why one begun of one partition
	// became a rebuild of the whole store.
	Abandoned string `json:"abandoned,omitempty"`
	Widened   string `json:"widened,omitempty"`
	// Completed counts the rebuilds finished since the process started.
	Completed int `json:"completed"`
}

// Config of a [Manager].
type Config struct {
	// Runtime is the live runtime's configuration; the rebuild runtime
	// takes it with the name <Name>-rebuild. Its Clock gives the times of
	// the rebuild's state and status.
	Runtime projector.Config
	// RetryMax bounds the backoff between attempts of a failed step (1s,
	// doubled per attempt); default 30s.
	RetryMax time.Duration
	// DropAfter is how long the previous generation is kept after the
	// switch before it is dropped: the time other instances take to follow
	// the switch (a projector in partitions). 0: dropped at once.
	DropAfter time.Duration
	// Partitions is the number of partitions the projector runs in (0 or
	// 1: none); a rebuild of one partition is refused without them.
	Partitions int
}

// Manager runs the rebuilds of one projector process.
type Manager struct {
	cfg     Config
	name    string
	stores  Stores // a BlueGreen or an InPlace
	sw      *Switch
	log     *slog.Logger
	backoff retry.Backoff // between attempts of a failed step

	poll   time.Duration // between readings of the state, waiting for a rebuild
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	openMu sync.Mutex    // Open
	ready  chan struct{} // closed once js and kv are set
	wake   chan struct{}

	mu        sync.Mutex
	fence     projector.Fencing   // of the lease term RunFenced runs in
	exclusive projector.Exclusive // of the partitions, when the projector runs in them
	running   bool                // RunFenced runs: this instance runs the rebuilds
	status    Status
	active    bool // a rebuild is in progress here
}

// NewManager returns a manager of the rebuilds of the projection whose
// live generation sw holds. It rebuilds stores blue/green or in place as
// they implement [BlueGreen] or [InPlace].
func NewManager(cfg Config, stores Stores, sw *Switch, log *slog.Logger) (*Manager, error) {
	if cfg.Runtime.Name == "" {
		return nil, errors.New("rebuild: the projector's name is required")
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 30 * time.Second
	}
	if cfg.Runtime.Clock == nil {
		cfg.Runtime.Clock = clock.Wall()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ip, err := isInPlace(stores)
	if err != nil {
		return nil, err
	}
	name := cfg.Runtime.Name
	return &Manager{cfg: cfg, name: name, stores: stores, sw: sw, log: log.With("rebuild", name),
		// One manager per projector, retrying its own step: nobody to
		// spread its retries out from.
		backoff: retry.Backoff{Min: min(time.Second, cfg.RetryMax), Max: cfg.RetryMax, Jitter: retry.NoJitter},
		poll:    min(2*time.Second, cfg.RetryMax),
		ready:   make(chan struct{}), wake: make(chan struct{}, 1),
		status: Status{Projector: name, Phase: PhaseIdle, InPlace: ip}}, nil
}

// ConsumerName is the durable consumer of the rebuild of projector name.
func ConsumerName(name string) string { return name + "-rebuild" }

// Run opens the state bucket, resumes a rebuild that a previous process
// left unfinished, and then runs the rebuilds [Manager.Start] asks for,
// until ctx ends.
func (m *Manager) Run(ctx context.Context, js jetstream.JetStream) error {
	return m.RunFenced(ctx, js, projector.Fencing{}, nil)
}

// Open opens the state bucket, trying again until it can or ctx ends, so
// that Start and Status answer. RunFenced opens it too: an instance of a
// partitioned projector that does not coordinate its rebuilds opens it
// alone, and a rebuild started there is run by the one that does.
func (m *Manager) Open(ctx context.Context, js jetstream.JetStream) {
	m.openMu.Lock()
	defer m.openMu.Unlock()
	select {
	case <-m.ready:
		return
	default:
	}
	for attempt := 1; ; attempt++ {
		// Create, never update: every projector shares the bucket, and
		// none may change its configuration under the others.
		kv, refusesRollups, err := sharedkv.Open(ctx, js, BucketConfig(m.cfg.Runtime.Replicas))
		if err == nil {
			if !refusesRollups {
				m.log.Warn("the rebuilds' bucket allows roll-ups, by which any projector can delete the others' rebuild state; run `converge streams apply` as the operator",
					"bucket", Bucket)
			}
			m.js, m.kv = js, kv
			close(m.ready)
			return
		}
		if ctx.Err() != nil {
			return
		}
		delay := m.backoff.Delay(attempt)
		m.log.Warn("rebuild state bucket unavailable; trying again", "bucket", Bucket, "in", delay, "err", err)
		if retry.Sleep(ctx, delay) != nil {
			return
		}
	}
}

// RunFenced is Run within a lease term: the rebuild runtime's writes, the
// wipe, the activation of a generation and the drop of the previous one
// each pass fence first and are bound to the term, so an instance that
// lost its lease (or is cut off from NATS past its validity) changes
// nothing more. exclusive, when not nil (a projector in partitions, whose
// live writers may run in other processes), is asked for every partition
// before the live writes are held back, and its fence is added to
// fence's for the writes made while they are.
func (m *Manager) RunFenced(ctx context.Context, js jetstream.JetStream, fence projector.Fencing, exclusive projector.Exclusive) error {
	m.Open(ctx, js)
	select {
	case <-m.ready:
	default:
		return nil // ctx ended
	}
	m.mu.Lock()
	m.fence, m.exclusive = fence, exclusive
	m.running = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
	}()
	for {
		st, err := m.load(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.log.Warn("reading the rebuild state failed", "err", err)
		case st.running():
			m.run(ctx, st)
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		case <-time.After(m.poll):
			// A rebuild started on another instance (partitions) is
			// found here.
		}
	}
}

// Start begins a rebuild of the whole store, unless one is in progress. It
// reports the rebuild's status and whether this call started it.
func (m *Manager) Start(ctx context.Context) (Status, bool, error) { return m.start(ctx, nil, nil) }

// StartPartition begins a rebuild of partition part alone, unless a
// rebuild is in progress (of the whole or of any partition: one at a
// time): its documents are wiped from the live generation and filled
// again from their events in the partitioned stream, while every
// partition's live writes are held back. The stores must be a
// [PartitionWiper] and the projector run in partitions; otherwise, or for
// a partition it does not have, the error is [ErrInvalid].
func (m *Manager) StartPartition(ctx context.Context, part int) (Status, bool, error) {
	n := m.cfg.Partitions
	switch {
	case n < 2:
		return Status{}, false, fmt.Errorf("%w: projector %s does not run in partitions: rebuild the whole store", ErrInvalid, m.name)
	case part < 0 || part >= n:
		return Status{}, false, fmt.Errorf("%w: partition %d: projector %s has partitions 0 to %d", ErrInvalid, part, m.name, n-1)
	}
	return m.start(ctx, &part, func() error {
		w, ok := m.stores.(PartitionWiper)
		if !ok {
			return fmt.Errorf("%w: %s cannot wipe one partition's documents: rebuild the whole store", ErrInvalid, m.stores.Describe(""))
		}
		if err := w.PartitionRefused(m.sw.Live()); err != nil {
			return fmt.Errorf("%w: %w: rebuild the whole store", ErrInvalid, err)
		}
		return nil
	})
}

// start begins a rebuild, of partition part alone when not nil, once
// check (nil: none) passes, unless one is in progress.
func (m *Manager) start(ctx context.Context, part *int, check func() error) (Status, bool, error) {
	select {
	case <-m.ready:
	case <-ctx.Done():
		return Status{}, false, ctx.Err()
	default:
		return Status{}, false, errors.New("rebuild: not ready yet (connecting to NATS)")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active {
		return m.status, false, nil
	}
	last, rev, err := m.loadRev(ctx)
	if err != nil {
		return Status{}, false, err
	}
	if last.running() {
		m.kick() // Run takes it up if it has not yet
		return m.statusOf(last, m.status.Completed), false, nil
	}
	if check != nil {
		if err := check(); err != nil {
			return Status{}, false, err
		}
	}
	now := m.cfg.Runtime.Clock.Now().UTC()
	st := &State{ID: now.Format("20060102T150405.000Z"), StartedAt: now}
	if part != nil {
		st.Partition, st.Partitions = part, m.cfg.Partitions
	}
	// No earlier rebuild consumer may remain: the new one starts at the
	// stream's first message. Deleted before the state is written, so that
	// a resumed rebuild never continues an older one's consumer.
	if err := m.deleteConsumer(ctx, m.sourceOf(st)); err != nil {
		return Status{}, false, err
	}
	if err := m.target(ctx, st); err != nil {
		return Status{}, false, err
	}
	if err := m.create(ctx, st, rev); err != nil {
		return Status{}, false, err
	}
	m.active = m.running // else the instance that runs rebuilds finds it within its poll
	m.setStatusLocked(st)
	m.log.Info("rebuild requested", "id", st.ID, "target", m.stores.Describe(st.Target), "in_place", st.InPlace, "partition", partitionOf(st))
	m.kick()
	return m.status, true, nil
}

// target sets the first phase of the rebuild st and the generations it
// fills and replaces: a fresh one, blue/green; the live one, in place (the
// stores hold one generation, or one partition of the one that holds them
// all is rebuilt).
func (m *Manager) target(ctx context.Context, st *State) error {
	live, err := m.stores.Live(ctx)
	if err != nil {
		return err
	}
	st.Previous = live
	if s, ok := m.stores.(BlueGreen); ok && st.Partition == nil {
		st.Phase, st.Target = PhaseFilling, s.Fresh()
		if st.Target == live {
			return fmt.Errorf("rebuild: the fresh generation's name %q is the live one's", live)
		}
		return nil
	}
	st.Phase, st.Target, st.InPlace = PhaseWiping, live, true
	return nil
}

// partitionOf is st's partition for logs: "all" for the whole store.
func partitionOf(st *State) any {
	if st.Partition == nil {
		return "all"
	}
	return *st.Partition
}

// kick wakes Run up to look for a rebuild to run.
func (m *Manager) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Status reports the rebuild in progress (with the rebuild consumer's
// progress), or the last one.
func (m *Manager) Status(ctx context.Context) Status {
	m.mu.Lock()
	s := m.status
	m.mu.Unlock()
	select {
	case <-m.ready:
	default:
		s.Phase = PhaseStarting // not connected yet
		return s
	}
	m.mu.Lock()
	active := m.active
	m.mu.Unlock()
	switch {
	case !active:
		// One left by a previous process, about to be resumed; one
		// another instance runs (partitions); or the last one, ended.
		st, err := m.load(ctx)
		switch {
		case err == nil && st != nil:
			s = m.statusOf(st, s.Completed)
		case err == nil && s.ID != "" && s.Phase != PhaseDone && s.Phase != PhaseIdle:
			s.Phase, s.Error = PhaseDone, ""
		}
	}
	if s.Phase != PhaseFilling && s.Phase != PhaseSwitching && s.Phase != PhaseRetrying {
		return s
	}
	src := m.source(s.Partition)
	if last, err := m.lastSeq(ctx, src); err == nil {
		s.StreamLastSeq = last
	}
	if c, err := m.js.Consumer(ctx, src.stream, ConsumerName(m.name)); err == nil {
		if info, err := c.Info(ctx); err == nil {
			s.AppliedSeq = info.AckFloor.Stream
			s.Pending = info.NumPending + uint64(info.NumAckPending)
		}
	}
	return s
}

// source is what a rebuild reads: a stream and, for one partition, the
// subjects of its documents there.
type source struct {
	stream string
	prefix string // the subjects' prefix; "" for the runtime's own
}

// sourceOf is what the rebuild st reads: the partitioned stream's subjects
// of its partition, or the live runtime's stream whole.
func (m *Manager) sourceOf(st *State) source { return m.source(st.Partition) }

// source is what a rebuild of partition part (nil: the whole store)
// reads.
func (m *Manager) source(part *int) source {
	if part != nil {
		return source{stream: contract.PartsStream, prefix: contract.PartitionSubjectPrefix(*part)}
	}
	if m.cfg.Runtime.Stream != "" {
		return source{stream: m.cfg.Runtime.Stream}
	}
	return source{stream: contract.DocsStream}
}

// run carries the rebuild st through its remaining phases, retrying a
// failed step until it succeeds or ctx ends.
func (m *Manager) run(ctx context.Context, st *State) {
	m.mu.Lock()
	m.active = true
	m.setStatusLocked(st)
	m.mu.Unlock()
	m.log.Info("rebuilding", "id", st.ID, "phase", st.Phase, "target", m.stores.Describe(st.Target), "in_place", st.InPlace, "partition", partitionOf(st))
	m.redeliver(ctx, m.sourceOf(st))
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := m.step(ctx, st)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			break
		}
		delay := m.backoff.Delay(attempt)
		m.log.Error("rebuild step failed; trying again", "phase", st.Phase, "attempt", attempt, "in", delay, "err", err)
		m.mu.Lock()
		m.status.Phase, m.status.Error = PhaseRetrying, err.Error()
		m.mu.Unlock()
		_ = retry.Sleep(ctx, delay) // the loop checks ctx
	}
	m.mu.Lock()
	m.active = false
	m.mu.Unlock()
	m.log.Info("rebuild interrupted; the next start of the projector resumes it", "id", st.ID, "phase", st.Phase)
}

// step runs the phases from st.Phase to the end, the way the stores are
// rebuilt. A rebuild begun the other way (the store was configured
// otherwise before a restart) fails, and is retried until the store is as
// it was.
func (m *Manager) step(ctx context.Context, st *State) error {
	if st.Partition != nil {
		return m.partition(ctx, st)
	}
	switch s := m.stores.(type) {
	case BlueGreen:
		if st.InPlace {
			return fmt.Errorf("rebuild %s was begun in place, but %s is rebuilt blue/green", st.ID, s.Describe(st.Target))
		}
		return m.blueGreen(ctx, s, st)
	case InPlace:
		if !st.InPlace {
			return fmt.Errorf("rebuild %s was begun blue/green, but %s is rebuilt in place", st.ID, s.Describe(st.Target))
		}
		return m.inPlace(ctx, st, func(ctx context.Context, g *Generation) error { return s.Wipe(ctx, g) }, nil)
	}
	return fmt.Errorf("rebuild: stores %T are neither blue/green nor in place", m.stores)
}

// partition carries the rebuild of one partition st through its
// remaining phases, as begun if it still can be. Otherwise it is
// abandoned where that leaves nothing to mend (the partitioned stream
// made anew, whose consumers fill every document again), and widened into
// a rebuild of the whole store where the partition's documents may be
// wiped, even in part (a wipe is saved done only once it is), and
// nothing would fill them again.
func (m *Manager) partition(ctx context.Context, st *State) error {
	part, n, running := *st.Partition, st.Partitions, m.cfg.Partitions
	w, ok := m.stores.(PartitionWiper)
	if !ok {
		return m.widen(ctx, st, m.stores.Describe(st.Target)+" cannot wipe one partition")
	}
	now, err := m.partitionsNow(ctx)
	if err != nil {
		return err
	}
	switch {
	case now == n && running == n:
	case running >= 2 && running != now:
		// This instance is configured otherwise than the stream (which
		// an instance in partitions refuses to start with): one
		// configured as the stream is resumes the rebuild.
		return fmt.Errorf("rebuild %s is of partition %d of %d, and the partitioned stream has %d partitions, but this instance runs in %d: run it with %d",
			st.ID, part, n, now, running, now)
	case now >= 2 && running == now:
		return m.abandon(ctx, st, fmt.Sprintf("the partitioned stream was made anew with %d partitions, not %d: its consumers read it from its start, filling every document again", now, n))
	default:
		return m.widen(ctx, st, fmt.Sprintf("the projector runs in %d partitions now (the partitioned stream has %d), not %d, and the partition may be wiped", running, now, n))
	}
	err = m.inPlace(ctx, st, func(ctx context.Context, g *Generation) error { return w.WipePartition(ctx, g, part, n) }, w.PartitionRefused)
	if r, ok := errors.AsType[*refusedError](err); ok {
		return m.widen(ctx, st, r.Error())
	}
	return err
}

// refusedError is a store's refusal to have one partition rebuilt alone
// (PartitionWiper.PartitionRefused).
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// widen makes the rebuild of one partition st a rebuild of the whole
// store, under the same id, and carries it through: the way a partition's
// documents are filled again when the partition's rebuild cannot be done
// as begun.
func (m *Manager) widen(ctx context.Context, st *State, why string) error {
	m.log.Warn("the rebuild of one partition becomes a rebuild of the whole store", "id", st.ID, "partition", partitionOf(st), "of", st.Partitions, "why", why)
	whole := &State{ID: st.ID, StartedAt: st.StartedAt, Widened: fmt.Sprintf("partition %d of %d: %s", *st.Partition, st.Partitions, why)}
	// The whole store's rebuild consumer starts at the stream's first
	// message; the partition's goes.
	for _, src := range []source{m.sourceOf(st), m.sourceOf(whole)} {
		if err := m.deleteConsumer(ctx, src); err != nil {
			return err
		}
	}
	if err := m.target(ctx, whole); err != nil {
		return err
	}
	if err := m.save(ctx, whole, false); err != nil {
		return err
	}
	*st = *whole
	m.setPhase(st, st.Phase)
	return m.step(ctx, st)
}

// blueGreen fills the fresh generation, then swaps it in.
func (m *Manager) blueGreen(ctx context.Context, stores BlueGreen, st *State) error {
	live, err := stores.Live(ctx)
	if err != nil {
		return err
	}
	if live == st.Target {
		// Crashed after the swap: only the clean-up is left.
		return m.dropPrevious(ctx, stores, st)
	}
	m.setPhase(st, PhaseFilling)
	target, err := stores.Open(ctx, st.Target)
	if err != nil {
		return fmt.Errorf("open %s: %w", stores.Describe(st.Target), err)
	}
	swapped := false
	defer func() {
		if !swapped {
			_ = target.close()
		}
	}()
	src := m.sourceOf(st)
	if err := m.fill(ctx, src, target, m.fenceNow()); err != nil {
		return err
	}
	// Hold the live writes back, catch up with the stream as it is then,
	// and swap: the fresh generation then holds every event the live
	// runtime acknowledged (it acknowledges nothing while held back), and
	// the live runtime goes on from its position.
	if live := m.sw.Live(); live != nil && live.Name != st.Previous && live.Name != st.Target && !slices.Contains(st.Superseded, live.Name) {
		// Recorded with the switching phase, before the switch, so that a
		// crash right after it still drops this generation (only this
		// manager changes what is live).
		m.log.Warn("the live generation is not the one recorded when the rebuild began; it is dropped as well",
			"live", stores.Describe(live.Name), "recorded", stores.Describe(st.Previous))
		st.Superseded = append(st.Superseded, live.Name)
	}
	m.setPhase(st, PhaseSwitching)
	if err := m.save(ctx, st, false); err != nil {
		return err
	}
	fence, resume, err := m.alone(ctx)
	if err != nil {
		return err
	}
	defer resume()
	if err := m.catchUpToLast(ctx, src, target, fence); err != nil {
		return err
	}
	if err := fence.Do(ctx, func(ctx context.Context) error { return stores.Activate(ctx, st.Target) }); err != nil {
		return fmt.Errorf("activate %s: %w", stores.Describe(st.Target), err)
	}
	m.sw.swapIn(target, resume, stores, m.log)
	swapped = true
	m.log.Info("rebuilt generation is live", "target", stores.Describe(st.Target))
	return m.dropPrevious(ctx, stores, st)
}

// dropPrevious drops the generation live when the rebuild began, and any
// superseded one, and then finishes the rebuild.
func (m *Manager) dropPrevious(ctx context.Context, stores BlueGreen, st *State) error {
	if m.cfg.DropAfter > 0 {
		m.log.Info("keeping the previous generation while the other instances follow the switch", "previous", stores.Describe(st.Previous), "for", m.cfg.DropAfter)
		if err := retry.Sleep(ctx, m.cfg.DropAfter); err != nil {
			return err
		}
	}
	for _, name := range append([]string{st.Previous}, st.Superseded...) {
		if name == st.Target {
			continue
		}
		if err := m.fenceNow().Do(ctx, func(ctx context.Context) error { return stores.Drop(ctx, name) }); err != nil {
			return fmt.Errorf("drop %s: %w", stores.Describe(name), err)
		}
	}
	return m.finish(ctx, st)
}

// inPlace wipes the live generation (the whole projection, or one
// partition's documents) with wipe and fills it again, with the live
// writes held back throughout. refused, when not nil, is asked of the
// live generation once the live writes are held back: its error, a
// *refusedError, ends the step before anything is written.
func (m *Manager) inPlace(ctx context.Context, st *State, wipe func(context.Context, *Generation) error, refused func(*Generation) error) error {
	fence, resume, err := m.alone(ctx)
	if err != nil {
		return err
	}
	defer resume()
	live, src := m.sw.Live(), m.sourceOf(st)
	if refused != nil {
		if err := refused(live); err != nil {
			return &refusedError{err}
		}
	}
	if st.Partition != nil && live.Name != st.Target {
		// A partition is rebuilt on whichever generation is live.
		m.log.Warn("the live generation is not the one recorded when the partition's rebuild began; rebuilding the partition on it",
			"live", m.stores.Describe(live.Name), "recorded", m.stores.Describe(st.Target))
		st.Target = live.Name
	}
	if st.Phase == PhaseWiping {
		m.setPhase(st, PhaseWiping)
		if err := fence.Do(ctx, func(ctx context.Context) error { return wipe(ctx, live) }); err != nil {
			return fmt.Errorf("wipe %s (partition %v): %w", m.stores.Describe(live.Name), partitionOf(st), err)
		}
		// A consumer left from an interrupted wipe would skip the stream's
		// start.
		if err := m.deleteConsumer(ctx, src); err != nil {
			return err
		}
		st.Phase = PhaseFilling
		if err := m.save(ctx, st, false); err != nil {
			return err
		}
	}
	m.setPhase(st, PhaseFilling)
	if err := m.fill(ctx, src, live, fence); err != nil {
		return err
	}
	if err := m.catchUpToLast(ctx, src, live, fence); err != nil {
		return err
	}
	// Finished before the live writes go on: once they do, on other
	// instances too, the rebuild has written its last.
	return m.finish(ctx, st)
}

// fenceNow is the fence of the lease term RunFenced runs in.
func (m *Manager) fenceNow() projector.Fencing {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fence
}

// alone holds the live writes back, once this instance holds every
// partition when the projector runs in them. It returns the fence of the
// writes made meanwhile (the lease term's, and every partition's) and the
// function that lets the live writes go on and the partitions go back to
// the other instances.
func (m *Manager) alone(ctx context.Context) (projector.Fencing, func(), error) {
	m.mu.Lock()
	fence, exclusive := m.fence, m.exclusive
	m.mu.Unlock()
	release := func() {}
	if exclusive != nil {
		m.log.Info("taking every partition: the live writes are held back while the rebuild writes alone")
		f, rel, err := exclusive(ctx)
		if err != nil {
			return fence, nil, fmt.Errorf("rebuild: taking every partition: %w", err)
		}
		fence, release = fence.And(f), rel
	}
	resume := m.sw.Pause()
	var once sync.Once
	return fence, func() { once.Do(func() { resume(); release() }) }, nil
}

// fill applies the stream to g in rounds, each up to the stream's last
// message when it begins, until a round ends close to the stream's end
// (within closeEnough messages). Under steady traffic the stream is never
// "caught up" at an instant, but each round is shorter than the one before
// as long as the rebuild applies faster than events arrive.
func (m *Manager) fill(ctx context.Context, src source, g *Generation, fence projector.Fencing) error {
	closeEnough := uint64(4 * max(m.cfg.Runtime.BatchSize, 256))
	for {
		last, err := m.lastSeq(ctx, src)
		if err != nil {
			return err
		}
		if err := m.catchUpTo(ctx, src, g, last, fence); err != nil {
			return err
		}
		now, err := m.lastSeq(ctx, src)
		if err != nil {
			return err
		}
		// A partition's last message may have gone (the stream's limits)
		// since it was read: now below last.
		if now <= last || now-last <= closeEnough {
			return nil
		}
		m.log.Debug("rebuild round done; another one", "behind", now-last)
	}
}

// catchUpToLast applies src to g up to its last message now.
func (m *Manager) catchUpToLast(ctx context.Context, src source, g *Generation, fence projector.Fencing) error {
	last, err := m.lastSeq(ctx, src)
	if err != nil {
		return err
	}
	return m.catchUpTo(ctx, src, g, last, fence)
}

// lastSeq is the sequence of src's last message: the stream's, or that of
// its last on src's subjects (0: none).
func (m *Manager) lastSeq(ctx context.Context, src source) (uint64, error) {
	s, err := m.js.Stream(ctx, src.stream)
	if err != nil {
		return 0, fmt.Errorf("rebuild: stream %s: %w", src.stream, err)
	}
	if src.prefix == "" {
		return s.CachedInfo().State.LastSeq, nil
	}
	msg, err := s.GetLastMsgForSubject(ctx, src.prefix+">")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("rebuild: the last message of %s> in %s: %w", src.prefix, src.stream, err)
	}
	return msg.Sequence, nil
}

// catchUpPoll is how often catchUpTo reads the rebuild consumer's position.
var catchUpPoll = 20 * time.Millisecond

// catchUpTo applies src to g with the rebuild consumer, its writes behind
// fence, until the consumer has acknowledged every message of src up to
// stream sequence target.
func (m *Manager) catchUpTo(ctx context.Context, src source, g *Generation, target uint64, fence projector.Fencing) error {
	rc := m.cfg.Runtime
	rc.Name = ConsumerName(m.name)
	if src.prefix != "" {
		rc.Stream, rc.SubjectPrefix = src.stream, src.prefix
	}
	rc.StopWhenCaughtUp = false
	rc.Fence, rc.Bound = fence.Fence, fence.Bound
	rt, err := projector.New(m.js, g.Store, rc, nil, m.log)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- rt.Run(runCtx) }()
	t := time.NewTicker(catchUpPoll)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				err = ctx.Err()
			}
			if err == nil {
				err = errors.New("rebuild: the rebuild runtime stopped")
			}
			return err
		case <-t.C:
		}
		c, err := m.js.Consumer(ctx, src.stream, ConsumerName(m.name))
		if err != nil {
			continue // not created yet
		}
		info, err := c.Info(ctx)
		if err != nil {
			continue
		}
		if info.AckFloor.Stream >= target || (info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= target) {
			stop() // the batch in progress is finished and acknowledged first
			if err := <-done; err != nil {
				return err
			}
			return ctx.Err()
		}
	}
}

// finish deletes the rebuild consumer and then records the rebuild done
// in its state.
func (m *Manager) finish(ctx context.Context, st *State) error { return m.end(ctx, st, "") }

// abandon ends the rebuild of a partition that need not go on, saying
// why in its state (Abandoned, with the phase done) and its log, so that
// the rebuilds asked next can run.
func (m *Manager) abandon(ctx context.Context, st *State, why string) error {
	m.log.Error("the rebuild of one partition is abandoned", "id", st.ID, "partition", partitionOf(st), "of", st.Partitions, "why", why)
	return m.end(ctx, st, why)
}

func (m *Manager) end(ctx context.Context, st *State, abandoned string) error {
	if err := m.deleteConsumer(ctx, m.sourceOf(st)); err != nil {
		return err
	}
	now := m.cfg.Runtime.Clock.Now().UTC()
	st.Phase, st.DoneAt, st.Abandoned = PhaseDone, &now, abandoned
	if err := m.save(ctx, st, false); err != nil {
		return err
	}
	m.mu.Lock()
	m.active = false
	completed := m.status.Completed
	if abandoned == "" {
		completed++
	}
	m.status = m.statusOf(st, completed)
	m.mu.Unlock()
	if abandoned == "" {
		m.log.Info("rebuild done", "id", st.ID, "target", m.stores.Describe(st.Target), "partition", partitionOf(st), "took", now.Sub(st.StartedAt).Round(time.Millisecond))
	}
	return nil
}

// partitionsNow is the number of partitions of the partitioned stream
// now; 0 when there is none.
func (m *Manager) partitionsNow(ctx context.Context) (int, error) {
	s, err := m.js.Stream(ctx, contract.PartsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("rebuild: stream %s: %w", contract.PartsStream, err)
	}
	n, _ := strconv.Atoi(s.CachedInfo().Config.Metadata[contract.MetaPartitions])
	return n, nil
}

// redeliver has the rebuild consumer deliver again, at once, what it
// delivered and nobody acknowledged: what a previous process (or this
// one's previous term) held when it stopped would otherwise wait for its
// ack wait, and the rebuild's catch-up with it.
func (m *Manager) redeliver(ctx context.Context, src source) {
	if _, err := m.js.Consumer(ctx, src.stream, ConsumerName(m.name)); err != nil {
		return // none yet (a rebuild begun), or unreadable: nothing to reset
	}
	switch _, err := m.js.ResetConsumer(ctx, src.stream, ConsumerName(m.name)); {
	case err == nil, errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound), ctx.Err() != nil:
	default:
		m.log.Warn("resetting the rebuild consumer failed: what a previous process held is delivered again after its ack wait", "err", err)
	}
}

func (m *Manager) deleteConsumer(ctx context.Context, src source) error {
	err := m.js.DeleteConsumer(ctx, src.stream, ConsumerName(m.name))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("rebuild: delete consumer %s: %w", ConsumerName(m.name), err)
	}
	return nil
}

func (m *Manager) setPhase(st *State, phase string) {
	st.Phase = phase
	m.mu.Lock()
	defer m.mu.Unlock()
	m.setStatusLocked(st)
}

func (m *Manager) setStatusLocked(st *State) { m.status = m.statusOf(st, m.status.Completed) }

// statusOf is the status of the rebuild st.
func (m *Manager) statusOf(st *State, completed int) Status {
	started := st.StartedAt
	return Status{Projector: m.name, ID: st.ID, Phase: st.Phase, InPlace: st.InPlace, Target: st.Target,
		Previous: st.Previous, Partition: st.Partition, Partitions: st.Partitions, StartedAt: &started, Completed: completed,
		DoneAt: st.DoneAt, Abandoned: st.Abandoned, Widened: st.Widened}
}

// InProgress reads the rebuilds in progress (or interrupted) from the
// bucket, by projector; none when the bucket does not exist.
func InProgress(ctx context.Context, js jetstream.JetStream) ([]State, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rebuild: bucket %s: %w", Bucket, err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("rebuild: bucket %s: %w", Bucket, err)
	}
	var out []State
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // finished meanwhile
		}
		if err != nil {
			return out, fmt.Errorf("rebuild: state of %s: %w", key, err)
		}
		var st State
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			return out, fmt.Errorf("rebuild: state of %s in %s is not valid: %w", key, Bucket, err)
		}
		st.Projector = key
		if st.running() {
			out = append(out, st)
		}
	}
	return out, nil
}

// load reads the state of the rebuild in progress (or interrupted), or of
// the last one, ended (State.running is false); nil when there is none.
func (m *Manager) load(ctx context.Context) (*State, error) {
	st, _, err := m.loadRev(ctx)
	return st, err
}

// loadRev is load with the state's revision (0: none).
func (m *Manager) loadRev(ctx context.Context) (*State, uint64, error) {
	e, err := m.kv.Get(ctx, m.name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("rebuild: read state: %w", err)
	}
	var st State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return nil, 0, fmt.Errorf("rebuild: state of %s in %s is not valid: %w", m.name, Bucket, err)
	}
	return &st, e.Revision(), nil
}

// create writes the state of a rebuild begun, in place of the ended one
// at revision rev (0: none): it fails if another was written meanwhile.
func (m *Manager) create(ctx context.Context, st *State, rev uint64) error {
	if rev == 0 {
		return m.save(ctx, st, true)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if _, err := m.kv.Update(ctx, m.name, b, rev); err != nil {
		return fmt.Errorf("rebuild: write state: %w", err)
	}
	return nil
}

// save writes the state; create refuses to replace an existing one.
func (m *Manager) save(ctx context.Context, st *State, create bool) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if create {
		_, err = m.kv.Create(ctx, m.name, b)
	} else {
		_, err = m.kv.Put(ctx, m.name, b)
	}
	if err != nil {
		return fmt.Errorf("rebuild: write state: %w", err)
	}
	return nil
}
