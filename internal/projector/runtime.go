// The runtime: its state, New, and Run, which starts consuming again
// after each failure until ctx ends.

package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/retry"
)

// Runtime runs one projector.
type Runtime struct {
	cfg     Config
	js      jetstream.JetStream
	store   Store
	metrics *Metrics
	log     *slog.Logger
	ready   chan struct{}
	once    sync.Once
	// consumed: this runtime had a consumer, so its disappearance is an
	// operator's doing.
	consumed bool
	// runConsumed: the current Run started a consumer already (a restart
	// within it continues what the runtime knows of its gaps).
	runConsumed bool
	// gaps follows the stream sequences delivered (Config.EveryEvent); the
	// consuming goroutine alone uses it.
	gaps      gapDetector
	removals  removals                               // see Config.Removals
	tookOver  atomic.Pointer[jetstream.ConsumerInfo] // see TookOver
	gapMu     sync.Mutex
	gapRecord GapRecord
	saveMu    sync.Mutex // one save of the gap record at a time
	// fenced is the refusal of Config.Fence that ends Run.
	fenced atomic.Pointer[FencedError]
	// applying is true while a batch is being applied (finish).
	applying atomic.Bool
}

// New returns a runtime applying the stream's events to store.
func New(js jetstream.JetStream, store Store, cfg Config, metrics *Metrics, log *slog.Logger) (*Runtime, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runtime{cfg: cfg, js: js, store: store, metrics: metrics, log: log.With("projector", cfg.Name), ready: make(chan struct{})}, nil
}

// Ready is closed once the consumer exists and the first fetch began.
func (r *Runtime) Ready() <-chan struct{} { return r.ready }

// Run consumes until ctx ends (or, with StopWhenCaughtUp, until nothing is
// pending). The batch in progress is finished, within its retries, before
// Run returns: messages are acknowledged or, if ctx ended during a retry,
// released for redelivery.
func (r *Runtime) Run(ctx context.Context) error {
	ctx = context.WithValue(ctx, runtimeKey{}, r.cfg.Name)
	if f, ok := r.store.(Forgetter); ok {
		defer f.Forget(context.WithoutCancel(ctx))
	}
	if err := deadletter.EnsureStream(ctx, r.js, max(r.cfg.Replicas, 1)); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting (a partition handed over at once)
		}
		return fmt.Errorf("projector %s: %w", r.cfg.Name, err)
	}
	r.fenced.Store(nil)
	r.runConsumed = false
	// What the runtime still owes itself when it stops is reported or
	// handed over to the next start.
	defer r.stopGaps(ctx)
	failures := 0
	for ctx.Err() == nil {
		done, err := r.consume(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if done {
			return err
		}
		failures++
		if errors.Is(err, jetstream.ErrConsumerDeleted) {
			r.log.Info("the consumer was deleted (a replay?); starting again", "err", err)
		} else {
			r.log.Warn("consuming failed; starting again", "err", err)
		}
		_ = retry.Sleep(ctx, r.backoff(failures)) // the loop checks ctx
	}
	return nil
}
