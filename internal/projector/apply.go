// Applying a batch: store calls in shards by document, transient
// retries, the fence and the term's bound around each call, and what
// each message's result makes of it.

package projector

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/converge-sync/converge/internal/retry"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// finish applies a prepared batch and acknowledges, naks or dead-letters
// each of its messages by the outcome.
func (r *Runtime) finish(ctx context.Context, b prepared) {
	if len(b.items) == 0 {
		return
	}
	r.applying.Store(true)
	defer r.applying.Store(false)
	start := time.Now()
	defer b.stopKeep()
	items := b.items
	results := r.applyWithRetry(ctx, items)
	for i, it := range items {
		res := results[i]
		var redeliver *RedeliverError
		var dead *DeadLetterError
		var fenced *FencedError
		switch {
		case errors.As(res.Err, &fenced):
			// Neither written nor acknowledged: the new writer has it.
			r.fenced.CompareAndSwap(nil, fenced)
			r.metrics.Fenced.Inc()
		case errors.As(res.Err, &dead):
			if r.deadLetter(ctx, it.msg, dead.Code, res.Err) {
				for _, m := range it.superseded {
					_ = m.Ack()
				}
			}
		case errors.As(res.Err, &redeliver):
			r.log.Debug("the store asked for a redelivery", "key", it.ev.Key, "version", it.ev.Version,
				"in", redeliver.After, "err", res.Err)
			r.nak(it, redeliver.After)
		case res.Err == nil:
			r.ack(it)
			r.metrics.Events.WithLabelValues(outcomeLabel(res.Outcome)).Inc()
			r.metrics.Events.WithLabelValues("superseded").Add(float64(len(it.superseded)))
			if !it.commitTime.IsZero() && res.Outcome == Applied {
				r.metrics.CommitToApplied.Observe(r.cfg.Clock.Now().Sub(it.commitTime).Seconds())
			}
		case IsPermanent(res.Err) && it.delivered >= uint64(r.cfg.MaxDeliver):
			reason := fmt.Errorf("store rejected version %d of %q after %d deliveries: %w", it.ev.Version, it.ev.Key, it.delivered, res.Err)
			if r.deadLetter(ctx, it.msg, "rejected", reason) {
				for _, m := range it.superseded {
					_ = m.Ack()
				}
			}
		case IsPermanent(res.Err):
			r.log.Warn("store rejected an event; it will be redelivered", "key", it.ev.Key, "version", it.ev.Version,
				"delivered", it.delivered, "max_deliver", r.cfg.MaxDeliver, "err", res.Err)
			r.nak(it, r.backoff(int(it.delivered)))
		default:
			// Only when ctx ended during transient retries: released for
			// prompt redelivery to whoever runs next.
			r.nak(it, 0)
		}
	}
	r.metrics.BatchSeconds.Observe(time.Since(start).Seconds())
	if telemetry.Tracing() {
		r.traceApplied(ctx, items, results, start)
	}
}

// traceApplied continues the trace of each traced event of a batch with a
// span: the batch's apply, from its start to now, with the event's outcome.
func (r *Runtime) traceApplied(ctx context.Context, items []*item, results []Result, start time.Time) {
	end := time.Now()
	for i, it := range items {
		if it.trace == "" {
			continue
		}
		_, span := tracer().Start(telemetry.WithTraceParent(ctx, it.trace), r.cfg.Name+" apply",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start),
			trace.WithAttributes(attribute.String("converge.projector", r.cfg.Name), attribute.String("converge.key", it.ev.Key),
				attribute.Int64("converge.version", it.ev.Version), attribute.Int("converge.batch.size", len(items)),
				attribute.Int64("messaging.delivery.count", int64(it.delivered))))
		if err := results[i].Err; err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(attribute.String("converge.outcome", outcomeLabel(results[i].Outcome)))
		}
		span.End(trace.WithTimestamp(end))
	}
}

// tracer is the current provider's: spans are made only with tracing on.
func tracer() trace.Tracer { return telemetry.Tracer("projector") }

// applyWithRetry applies the items, retrying the transiently failed ones
// with backoff until they succeed, fail permanently, or ctx ends.
func (r *Runtime) applyWithRetry(ctx context.Context, items []*item) []Result {
	results := make([]Result, len(items))
	todo := make([]int, len(items))
	for i := range todo {
		todo[i] = i
	}
	for attempt := 1; ; attempt++ {
		batch := make([]*item, len(todo))
		for j, i := range todo {
			batch[j] = items[i]
		}
		res := r.applySharded(ctx, batch)
		var again []int
		var firstErr error
		for j, i := range todo {
			results[i] = res[j]
			if retryInPlace(res[j].Err) {
				again = append(again, i)
				if firstErr == nil {
					firstErr = res[j].Err
				}
			}
		}
		if len(again) == 0 || ctx.Err() != nil {
			return results
		}
		r.metrics.Retries.Inc()
		delay := r.backoff(attempt)
		r.log.Warn("store write failed; retrying", "documents", len(again), "attempt", attempt, "in", delay, "err", firstErr)
		_ = retry.Sleep(ctx, delay)
		if ctx.Err() != nil {
			return results
		}
		todo = again
	}
}

// applySharded applies the items' events in Parallel shards by document
// key.
func (r *Runtime) applySharded(ctx context.Context, items []*item) []Result {
	n := min(r.cfg.Parallel, len(items))
	if n <= 1 {
		return r.applyShard(ctx, items)
	}
	shards := make([][]int, n)
	for i, it := range items {
		h := fnv.New32a()
		_, _ = h.Write([]byte(it.ev.Key))
		s := int(h.Sum32() % uint32(n))
		shards[s] = append(shards[s], i)
	}
	results := make([]Result, len(items))
	var wg sync.WaitGroup
	for _, shard := range shards {
		if len(shard) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			its := make([]*item, len(shard))
			for j, i := range shard {
				its[j] = items[i]
			}
			for j, res := range r.applyShard(ctx, its) {
				results[shard[j]] = res
			}
		}()
	}
	wg.Wait()
	return results
}

// applyShard applies the items' events: the originals in one store call,
// the repairs in another whose ctx is marked with WithRepair.
func (r *Runtime) applyShard(ctx context.Context, items []*item) []Result {
	results := make([]Result, len(items))
	for _, repair := range []bool{false, true} {
		var call []*item
		var idx []int
		for i, it := range items {
			if it.repair == repair {
				call = append(call, it)
				idx = append(idx, i)
			}
		}
		if len(call) == 0 {
			continue
		}
		callCtx := ctx
		if repair {
			callCtx = WithRepair(ctx)
		}
		for j, res := range r.safeApply(callCtx, call) {
			results[idx[j]] = res
		}
	}
	return results
}

// safeApply asks the fence, then calls the store within the bound of the
// term (Config.Bound) when there is one.
func (r *Runtime) safeApply(ctx context.Context, items []*item) []Result {
	var res []Result
	if r.cfg.Fence != nil {
		if err := r.cfg.Fence(ctx); err != nil {
			res = make([]Result, len(items))
			for i := range res {
				res[i].Err = &FencedError{Err: err}
			}
			return res
		}
	}
	if r.cfg.Writable != nil {
		ctx = WithWritable(ctx, r.cfg.Writable)
	}
	if r.cfg.Bound == nil {
		return r.storeApply(ctx, items)
	}
	bound, cancel := r.cfg.Bound(ctx)
	defer cancel()
	res = r.storeApply(bound, items)
	if ctx.Err() == nil && bound.Err() != nil {
		// The term ended during the call: whatever it reports, no result
		// of it may be acknowledged by this writer.
		for i := range res {
			res[i].Err = &FencedError{Err: context.Cause(bound)}
		}
	}
	return res
}

// storeApply calls the store, turning a malformed answer into errors.
func (r *Runtime) storeApply(ctx context.Context, items []*item) []Result {
	var res []Result
	if ds, ok := r.store.(DeliveryStore); ok {
		deliveries := make([]Delivery, len(items))
		for i, it := range items {
			deliveries[i] = Delivery{Event: it.ev, CommitTime: it.commitTime, Stored: it.stored, Delivered: it.delivered, TraceParent: it.trace}
		}
		res = ds.ApplyDeliveries(ctx, deliveries)
	} else {
		events := make([]*contract.Event, len(items))
		for i, it := range items {
			events[i] = it.ev
		}
		res = r.store.Apply(ctx, events)
	}
	if len(res) != len(items) {
		err := fmt.Errorf("projector %s: store returned %d results for %d events", r.cfg.Name, len(res), len(items))
		res = make([]Result, len(items))
		for i := range res {
			res[i].Err = err
		}
	}
	return res
}

// backoff is the delay before retry number attempt (from 1).
func (r *Runtime) backoff(attempt int) time.Duration {
	return retry.Backoff{Min: r.cfg.RetryMin, Max: r.cfg.RetryMax, Jitter: r.cfg.RetryJitter}.Delay(attempt)
}

func outcomeLabel(o Outcome) string {
	if o == Skipped {
		return "skipped"
	}
	return "applied"
}
