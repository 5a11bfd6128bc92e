// Partitions: N instances of one projector share its store, each partition
// of the documents written by one instance at a time.

package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/retry"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/pkg/contract"
)

// A partitioned projector (ServiceConfig.Partitions > 1) consumes the
// partitioned stream (contract.PartsStream) with one runtime per
// partition: durable consumer <name>-pNN on the partition's subjects, its
// own lease <name>.pNN, its own dead letters converge.dlq.<name>-pNN.
// Every instance follows the others (lease.Members) and holds the
// partitions that rendezvous hashing with bounded loads gives it among the
// live ones (a share each, within one). It hands a partition over (its
// batch in hand finished, its lease released) when an instance joins that
// should hold it, and takes a dead instance's partitions once their leases
// expire, as a standby takes the store's lease. A partition has one writer
// at a time: the lease, taken only by the instance that wants it, with the
// fencing of the store's lease.
//
// The move of a running deployment: the operator creates the partitioned
// stream (`converge streams apply -partitions N`, which the server fills
// from the documents' stream's first message), then restarts the
// instances with -partitions N. The first of them marks the projector
// partitioned (lease.MarkPartitioned) and waits for the store's lease,
// <name>: the one writer of before sees the mark, finishes its batch and
// stops (and an instance started without -partitions refuses to start).
// Still holding that lease, it starts each partition's consumer at the
// first copy of a message the one writer had not acknowledged
// (takeOverFromOneWriter), and deletes the one writer's consumer. Only
// then does any partition write. Every event reaches its partition in the
// documents' stream's order, what the one writer applied without
// acknowledging comes again (the stores' version guards skip it), and no
// two writers write one document at any moment.

// errUnwanted ends a partition's term: another live instance should hold
// it.
var errUnwanted = errors.New("projector: another live instance should hold this partition")

// ErrPartitioned refuses to run a projector without partitions whose
// instances have moved to them.
var ErrPartitioned = errors.New("projector: this projector runs in partitions")

// partitionedNow is an [ErrPartitioned] when the projector of l has been
// marked partitioned, nil when it has not, and the reading's error when
// the mark cannot be read.
func partitionedNow(ctx context.Context, l *lease.Lease) error {
	n, err := l.Partitioned(ctx)
	if err != nil {
		return fmt.Errorf("projector: reading the partitions' mark: %w", err)
	}
	if n < 2 {
		return nil
	}
	return fmt.Errorf("%w (%d partitions, recorded in %s): start every instance of it with -partitions %d", ErrPartitioned, n, lease.Bucket, n)
}

// PartitionLease is the lease of partition p of the projector called name.
func PartitionLease(name string, p int) string {
	return name + ".p" + fmt.Sprintf("%02d", p)
}

// watchTerm ends the term's context when the lease is lost; for a
// partition, when this instance should no longer hold it; for the store's
// one writer, when the projector has moved to partitions.
func (h *holder) watchTerm(ctx context.Context, t *lease.Term, cancel context.CancelCauseFunc) {
	var tick <-chan time.Time
	if h.part == nil && h.lease != nil && !h.sc.Unpartitioned {
		every := time.NewTicker(h.lease.Config().TTL)
		defer every.Stop()
		tick = every.C
	}
	var changed <-chan struct{}
	if h.part != nil {
		changed = h.part.Changed()
		if !h.part.Wants(h.leaseName()) {
			cancel(errUnwanted)
			return
		}
	}
	for {
		select {
		case <-t.Lost():
			cancel(lease.ErrLost)
			return
		case <-ctx.Done():
			return
		case <-changed:
			changed = h.part.Changed()
			if !h.part.Wants(h.leaseName()) {
				cancel(errUnwanted)
				return
			}
		case <-tick:
			// An unreadable mark is read again at the next tick.
			if err := partitionedNow(ctx, h.lease); errors.Is(err, ErrPartitioned) {
				h.log.Error("the projector has moved to partitions: this instance, without them, stops writing", "err", err)
				cancel(err)
				return
			}
		}
	}
}

// partitioned runs the partitions this instance should hold.
type partitioned struct {
	sc      ServiceConfig
	js      jetstream.JetStream
	store   Store
	deps    service.Deps
	log     *slog.Logger
	started atomic.Bool
	waiting atomic.Pointer[string] // what it waits for before holding anything
	members *lease.Members         // once joined
	holders []*holder              // one per partition, once joined
}

func newPartitioned(sc ServiceConfig, js jetstream.JetStream, store Store, deps service.Deps) (*partitioned, error) {
	if sc.Partitions > contract.MaxPartitions {
		return nil, fmt.Errorf("projector %s: -partitions %d: at most %d", sc.Runtime.Name, sc.Partitions, contract.MaxPartitions)
	}
	if sc.Unpartitioned {
		return nil, fmt.Errorf("projector %s: this service does not run in partitions", sc.Runtime.Name)
	}
	if sc.Prepare != nil {
		return nil, fmt.Errorf("projector %s: partitions do not prepare their runtimes (their source's Move does)", sc.Runtime.Name)
	}
	sc.Lease.TTL = sc.Lease.TTLOrDefault()
	p := &partitioned{sc: sc, js: js, store: store, deps: deps, log: deps.Log.With("projector", sc.Runtime.Name, "partitions", sc.Partitions)}
	p.wait("the partitioned stream")
	return p, nil
}

func (p *partitioned) wait(what string) { p.waiting.Store(&what) }

// ready is nil once this instance has joined the members and runs its
// partitions' holders.
func (p *partitioned) ready() error {
	if p.started.Load() {
		return nil
	}
	return errors.New("waiting for " + *p.waiting.Load())
}

// retrying calls f until it succeeds or ctx ends (nil then).
func (p *partitioned) retrying(ctx context.Context, what string, f func() error) error {
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Warn(what+" failed; trying again", "err", err)
		_ = retry.Sleep(ctx, retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(attempt))
	}
}

func (p *partitioned) run(ctx context.Context) error {
	name, n := p.sc.Runtime.Name, p.sc.Partitions
	wait := p.waitStream
	if src := p.sc.Source; src != nil {
		wait = func(ctx context.Context) error { return src.Wait(ctx, p.js, n) }
	}
	if err := wait(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	holder := holderName(p.sc)
	p.wait("the store's lease: its writer without partitions must stop first")
	var whole *lease.Lease
	if err := p.retrying(ctx, "opening the leases' bucket", func() (err error) {
		whole, err = lease.Open(ctx, p.js, lease.Config{Name: name, TTL: p.sc.Lease.TTL, Replicas: p.sc.Lease.Replicas, Holder: holder, Clock: p.sc.Runtime.Clock}, p.log)
		return err
	}); err != nil || ctx.Err() != nil {
		return nil
	}
	if err := p.retrying(ctx, "marking the projector partitioned", func() error { return whole.MarkPartitioned(ctx, n) }); err != nil || ctx.Err() != nil {
		return nil
	}
	for {
		t, err := whole.Acquire(ctx, func(v lease.Value) {
			p.log.Info("waiting for the store's writer without partitions to stop (it reads the partitions' mark within its lease's TTL)", "writer", v.Holder)
		})
		if err != nil {
			return nil // ctx ended
		}
		// While no other instance writes: the partitions start where the
		// one writer of before stopped, and its consumer goes.
		err = p.moveFromOneWriter(ctx, t, name, n)
		t.Release()
		if err == nil || ctx.Err() != nil {
			break
		}
		p.log.Warn("the move from the writer without partitions failed; taking the store's lease again", "err", err)
		_ = retry.Sleep(ctx, time.Second)
	}
	if ctx.Err() != nil {
		return nil
	}

	p.wait("the other instances")
	var members *lease.Members
	var leases []string
	for part := range n {
		leases = append(leases, PartitionLease(name, part))
	}
	if err := p.retrying(ctx, "opening the members", func() (err error) {
		// The leases' holder name, defaults applied (host-pid without a
		// configured one or a metrics address): two instances must not
		// share a member id.
		members, err = lease.OpenMembers(ctx, p.js, name, whole.Config().Holder, leases, p.sc.Lease.TTL, p.sc.Lease.Replicas, p.log)
		return err
	}); err != nil || ctx.Err() != nil {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return members.Run(gctx) })
	select {
	case <-members.Joined():
	case <-gctx.Done():
		return g.Wait()
	}
	p.members = members
	for part := range n {
		h, err := newHolder(p.sc, p.runtimeConfig(part), p.js, p.store, p.deps, members)
		if err != nil {
			return err
		}
		h.leaseKey = PartitionLease(name, part)
		p.holders = append(p.holders, h)
		g.Go(func() error { return h.run(gctx) })
	}
	if p.sc.Alongside != nil {
		g.Go(func() error { return p.coordinate(gctx, holder) })
	}
	p.started.Store(true)
	p.log.Info("partitions: following the other instances", "member", members.ID(), "live", len(members.Live()))
	return g.Wait()
}

// moveFromOneWriter takes over from the one writer of before while this
// instance holds its lease (t): by the source's Move, or from the
// documents' stream's consumer.
func (p *partitioned) moveFromOneWriter(ctx context.Context, t *lease.Term, name string, n int) error {
	src := p.sc.Source
	if src == nil {
		p.takeOverFromOneWriter(ctx, name, n)
		return nil
	}
	p.wait("the move from the writer without partitions")
	return src.Move(ctx, p.js, Fencing{Fence: t.Check, Bound: t.Bound}, t.Valid)
}

// CoordinatorLease is the lease of the instance of a partitioned
// projector called name that runs the work beside its runtimes (its
// rebuilds): one instance among them, any.
func CoordinatorLease(name string) string { return name + ".rebuild" }

// coordinate runs ServiceConfig.Alongside while this instance holds the
// coordinator's lease, standing by while another does.
func (p *partitioned) coordinate(ctx context.Context, holder string) error {
	key := CoordinatorLease(p.sc.Runtime.Name)
	log := p.log.With("lease", key)
	var l *lease.Lease
	if err := p.retrying(ctx, "opening the coordinator's lease", func() (err error) {
		l, err = lease.Open(ctx, p.js, lease.Config{Name: key, TTL: p.sc.Lease.TTL, Replicas: p.sc.Lease.Replicas, Holder: holder, Clock: p.sc.Runtime.Clock}, log)
		return err
	}); err != nil || ctx.Err() != nil {
		return nil
	}
	for {
		t, err := l.Acquire(ctx, nil)
		if err != nil {
			return nil // ctx ended
		}
		log.Info("this instance coordinates the projector's rebuilds")
		tctx, cancel := context.WithCancelCause(ctx)
		go func() {
			select {
			case <-t.Lost():
				cancel(lease.ErrLost)
			case <-tctx.Done():
			}
		}()
		err = p.sc.Alongside(tctx, p.js, Fencing{Fence: t.Check, Bound: t.Bound}, p.holdAll)
		lost := errors.Is(context.Cause(tctx), lease.ErrLost)
		cancel(nil)
		t.Release()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !lost:
			return err
		}
		log.Warn("lost the coordinator's lease; standing by", "err", err)
	}
}

// holdAll is this instance's [Exclusive]: it claims every partition and
// waits until it holds them all.
func (p *partitioned) holdAll(ctx context.Context) (Fencing, func(), error) {
	p.members.Claim(ctx, true)
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.sc.Lease.TTL)
		defer cancel()
		p.members.Claim(rctx, false)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	began, told := time.Now(), time.Now()
	// Every instance hands its partitions over within a batch and a
	// renewal; one that does not (its store call stuck) fails the step,
	// which releases the claim and tries again.
	bound := 10 * p.sc.Lease.TTL
	for {
		var terms []*lease.Term
		for _, h := range p.holders {
			if term := h.term.Load(); term != nil && term.Valid() {
				terms = append(terms, term)
			}
		}
		if len(terms) == len(p.holders) {
			p.log.Info("holding every partition", "took", time.Since(began).Round(time.Millisecond))
			return termsFence(terms), release, nil
		}
		if time.Since(began) >= bound {
			release()
			return Fencing{}, func() {}, fmt.Errorf("projector %s: %d of %d partitions handed over to this instance within %v (the others' holders: stuck in a store call?)",
				p.sc.Runtime.Name, len(terms), len(p.holders), bound)
		}
		if time.Since(told) >= 5*time.Second {
			p.log.Info("waiting for the other instances to hand every partition over", "held", len(terms), "of", len(p.holders), "claimer", p.members.Claimer())
			told = time.Now()
		}
		select {
		case <-ctx.Done():
			release()
			return Fencing{}, func() {}, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// termsFence is the fence of every one of terms.
func termsFence(terms []*lease.Term) Fencing {
	var f Fencing
	for _, t := range terms {
		f = f.And(Fencing{Fence: t.Check, Bound: t.Bound})
	}
	return f
}

// waitStream waits for the partitioned stream, and checks its number of
// partitions.
func (p *partitioned) waitStream(ctx context.Context) error {
	told := false
	for {
		s, err := p.js.Stream(ctx, contract.PartsStream)
		switch {
		case err == nil:
			have := s.CachedInfo().Config.Metadata[contract.MetaPartitions]
			if have != strconv.Itoa(p.sc.Partitions) {
				return fmt.Errorf("projector %s: the partitioned stream %s has %s partitions, -partitions is %d: give every instance the stream's number (or make the stream anew: converge streams apply -partitions %d -repartition, every instance stopped)",
					p.sc.Runtime.Name, contract.PartsStream, have, p.sc.Partitions, p.sc.Partitions)
			}
			return nil
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrStreamNotFound):
			if !told {
				p.log.Warn("waiting for the partitioned stream: run `converge streams apply -partitions " + strconv.Itoa(p.sc.Partitions) + "` as the operator")
				told = true
			}
		default:
			p.log.Warn("reading the partitioned stream failed; trying again", "err", err)
		}
		_ = retry.Sleep(ctx, time.Second)
	}
}

// runtimeConfig is the runtime configuration of partition part.
func (p *partitioned) runtimeConfig(part int) Config {
	if src := p.sc.Source; src != nil {
		rc := src.Runtime(p.sc.Runtime, part)
		rc.Name = contract.PartitionName(p.sc.Runtime.Name, part)
		return rc
	}
	rc := p.sc.Runtime
	rc.Name = contract.PartitionName(p.sc.Runtime.Name, part)
	rc.Stream = contract.PartsStream
	rc.SubjectPrefix = contract.PartitionSubjectPrefix(part)
	return rc
}

// takeOverFromOneWriter, called while this instance holds the store's
// lease, moves a projector that had one writer to its partitions: each
// partition's consumer that does not exist yet starts at the first message
// of the partitioned stream the one writer had not acknowledged (every
// message before it is applied: the one writer acknowledged it, and wrote
// nothing since it gave the lease up), and the one writer's consumer is
// deleted, as nobody consumes it any more. Without that consumer (a
// deployment that began in partitions, or moved already) it does nothing;
// where its position cannot be read, the partitions start at the
// partitioned stream's first message, which the stores' version guards
// make a replay.
func (p *partitioned) takeOverFromOneWriter(ctx context.Context, name string, n int) {
	stream := p.sc.Runtime.Stream
	if stream == "" {
		stream = contract.DocsStream
	}
	old, err := p.js.Consumer(ctx, stream, name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), ctx.Err() != nil:
		return
	case err != nil:
		p.log.Warn("reading the consumer of the writer without partitions failed; the partitions start at the partitioned stream's first message", "err", err)
		return
	}
	floor := old.CachedInfo().AckFloor.Stream
	start, err := p.partsSeqAfter(ctx, floor)
	if err != nil {
		p.log.Warn("finding where the partitions start failed; they start at the partitioned stream's first message", "err", err)
		start = 0
	}
	for part := range n {
		rc := p.runtimeConfig(part)
		if err := rc.setDefaults(); err != nil {
			return
		}
		cc := consumerConfig(rc)
		if start > 1 {
			cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
		}
		// Create only: a partition's consumer that exists keeps its
		// position.
		if _, err := p.js.CreateConsumer(ctx, contract.PartsStream, cc); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			p.log.Warn("creating a partition's consumer failed; its runtime creates it at the partitioned stream's first message", "consumer", rc.Name, "err", err)
		}
	}
	p.log.Info("the partitions take over from the writer without partitions", "its_ack_floor", floor, "partitions_start_at", max(start, 1))
	switch err := p.js.DeleteConsumer(ctx, stream, name); {
	case err == nil:
		p.log.Info("deleted the consumer of the writer without partitions", "stream", stream, "consumer", name)
	case errors.Is(err, jetstream.ErrConsumerNotFound), ctx.Err() != nil:
	default:
		p.log.Warn("deleting the consumer of the writer without partitions failed; it stays, unconsumed", "err", err)
	}
}

// partsSeqAfter is the sequence of the partitioned stream from which its
// messages come from the documents' stream after its sequence floor: a
// binary search on the source sequences the copies carry, which grow with
// the partitioned stream's sequence. Past the last message when none does
// yet.
func (p *partitioned) partsSeqAfter(ctx context.Context, floor uint64) (uint64, error) {
	s, err := p.js.Stream(ctx, contract.PartsStream)
	if err != nil {
		return 0, err
	}
	state := s.CachedInfo().State
	if state.LastSeq == 0 {
		return 1, nil
	}
	lo, hi := state.FirstSeq, state.LastSeq+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// The first message at or after mid (the stream's limits may have
		// removed some).
		m, err := s.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(contract.PartsSubjectPrefix+">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, err
		}
		src, err := contract.SourceSequence(m.Header.Get(contract.HeaderStreamSource))
		if err != nil {
			return 0, err
		}
		if src > floor {
			hi = mid
		} else {
			lo = m.Sequence + 1
		}
	}
	return lo, nil
}
