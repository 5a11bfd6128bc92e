package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// DeadLetterCode is the code of the notifier's dead letters.
const DeadLetterCode = "webhook_failed"

// Notifier sends the notifications of the events the projector runtime
// hands it. It is a [projector.DeliveryStore]; run it with
// Config.EveryEvent so that every version is notified.
type Notifier struct {
	cfg     Config
	kv      jetstream.KeyValue
	targets []*target
	client  *http.Client
	metrics *Metrics
	log     *slog.Logger

	stopping chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup // the sends, which may outlive the batch that started them

	mu       sync.Mutex
	inflight map[uuid.UUID]*job // one send per effect in this process
	unmarked map[uuid.UUID]uint64

	sightings *sightings // how long each record has been seen unchanged

	// hook, when set (tests), is called after an effect is claimed
	// ("claimed") and after its request was answered ("sent").
	hook func(stage string, effect uuid.UUID)
}

// target is one webhook URL. The URL is a credential: it goes into
// requests and, hashed, into effect ids, and nowhere else.
type target struct {
	url    string
	name   string        // its public name (targetNames): for logs, metrics, records, dead letters, spans, errors
	hidden []string      // the parts of url its name leaves out (hiddenParts)
	effect string        // effectName(url), only ever hashed
	slots  chan struct{} // requests in flight, at most Concurrency
}

// job is the sending of one effect.
type job struct {
	effect uuid.UUID
	target *target
	ev     *contract.Event
	trace  string // the event's traceparent, sent on with the webhook
	// writable says whether this instance's lease term lets it write now
	// (projector.Writable).
	writable func() bool
	done     chan struct{}
	out      outcome // set before done is closed
}

type outcomeKind int

const (
	sent        outcomeKind = iota // answered 2xx, and marked
	duplicate                      // already sent
	later                          // to be tried again after the delay
	dead                           // MaxAttempts failed
	storeFailed                    // the dedup store failed: retried in place
)

type outcome struct {
	kind  outcomeKind
	after time.Duration // later
	rev   uint64        // dead: the record's revision
	err   error
}

// New opens (or creates) the dedup store and returns a notifier. Close it
// once the runtime has stopped.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, metrics *Metrics, log *slog.Logger) (*Notifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "converge notifier: one record per effect (webhook notification), kept for the dedup window",
		History:     1,
		TTL:         cfg.Window + cfg.ClockSkew,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("notifier: dedup store %s: %w", cfg.Bucket, err)
	}
	n := &Notifier{cfg: cfg, kv: kv, client: cfg.Client, metrics: metrics, log: log,
		stopping: make(chan struct{}), inflight: map[uuid.UUID]*job{}, unmarked: map[uuid.UUID]uint64{},
		sightings: newSightings(4 * (cfg.ClaimTimeout + cfg.RetryMax))}
	if n.client == nil {
		n.client = newClient(cfg.Concurrency)
	}
	names := targetNames(cfg.URLs)
	for i, u := range cfg.URLs {
		n.targets = append(n.targets, &target{url: u, name: names[i], hidden: hiddenParts(u), effect: effectName(u),
			slots: make(chan struct{}, cfg.Concurrency)})
	}
	return n, nil
}

// Close waits for the sends in flight to end (within HTTPTimeout); sends
// still waiting for a slot are abandoned, their events being redelivered.
func (n *Notifier) Close() error {
	n.stopOnce.Do(func() { close(n.stopping) })
	n.wg.Wait()
	return nil
}

// EffectID is the id of the effect of notifying url of the event eventID,
// the Idempotency-Key of its requests.
func EffectID(url string, eventID uuid.UUID) uuid.UUID {
	return contract.EffectID(effectName(url), eventID)
}

// effectName is the effect of notifying url, as [contract.EffectID] names
// it. It holds the whole URL, credentials included, so it is only ever
// hashed (a UUIDv5), never stored or shown. It must not change: the
// effect ids, and the dedup records keyed by them, must stay the same
// across an upgrade.
func effectName(url string) string { return "webhook:" + url }

// Apply notifies events of unknown age (see ApplyDeliveries).
func (n *Notifier) Apply(ctx context.Context, events []*contract.Event) []projector.Result {
	ds := make([]projector.Delivery, len(events))
	for i, ev := range events {
		ds[i] = projector.Delivery{Event: ev}
	}
	return n.ApplyDeliveries(ctx, ds)
}

// ApplyDeliveries sends the effects of the deliveries, waiting at most
// SendWait for their answers. An event's result is Applied when one of its
// effects was sent, Skipped when none needed to be (all sent before, or
// the event is not notified); a [projector.Redeliver] error when one must
// be tried again later; a [projector.DeadLetter] error when one was given
// up; a plain error when the dedup store failed.
func (n *Notifier) ApplyDeliveries(ctx context.Context, ds []projector.Delivery) []projector.Result {
	res := make([]projector.Result, len(ds))
	jobs := make([][]*job, len(ds))
	repair := projector.IsRepair(ctx)
	for i, d := range ds {
		if reason := n.skipReason(d, repair); reason != "" {
			res[i].Outcome = projector.Skipped
			n.metrics.Skipped.WithLabelValues(reason).Inc()
			n.log.Debug("event not notified", "reason", reason, "key", d.Event.Key, "version", d.Event.Version,
				"committed", d.CommitTime)
			continue
		}
		for _, t := range n.targets {
			jobs[i] = append(jobs[i], n.start(d.Event, d.TraceParent, t, projector.Writable(ctx)))
		}
	}
	wait := time.NewTimer(n.cfg.SendWait)
	defer wait.Stop()
	waiting := true
	for i, d := range ds {
		if jobs[i] == nil {
			continue
		}
		outs := make([]outcome, len(jobs[i]))
		for k, j := range jobs[i] {
			if waiting {
				select {
				case <-j.done:
				case <-wait.C:
					waiting = false
				case <-ctx.Done():
					waiting = false
				}
			}
			select {
			case <-j.done:
				outs[k] = j.out
			default:
				outs[k] = outcome{kind: later, after: n.cfg.SendWait,
					err: fmt.Errorf("webhook %s: no answer within %v; the request goes on meanwhile", j.target.name, n.cfg.SendWait)}
			}
		}
		res[i] = n.settle(d.Event, jobs[i], outs)
	}
	return res
}

// Finished reports whether every effect of ev is sent, as its record
// says, waiting (within ClaimTimeout) for a send still in flight: an event
// handed back while its send went on past SendWait, and then removed by
// the stream's limits, was notified all the same ([projector.Finisher]).
func (n *Notifier) Finished(ctx context.Context, ev *contract.Event) bool {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ClaimTimeout)
	defer cancel()
	for _, t := range n.targets {
		effect := contract.EffectID(t.effect, ev.ID)
		n.mu.Lock()
		j := n.inflight[effect]
		n.mu.Unlock()
		if j != nil {
			select {
			case <-j.done:
			case <-ctx.Done():
				return false
			}
		}
		kctx, cancel := context.WithTimeout(ctx, kvTimeout)
		e, err := n.kv.Get(kctx, effect.String())
		cancel()
		var rec record
		if err != nil || json.Unmarshal(e.Value(), &rec) != nil || rec.State != stateSent {
			return false
		}
	}
	return true
}

// skipReason says why an event is not notified, if it is not.
func (n *Notifier) skipReason(d projector.Delivery, repair bool) string {
	if n.cfg.NotifyReplayed {
		return ""
	}
	if repair {
		return "reemission"
	}
	at := d.CommitTime
	if at.IsZero() {
		at = d.Stored
	}
	if !at.IsZero() && n.cfg.Clock.Now().Sub(at) > n.cfg.Window {
		return "beyond_window"
	}
	return ""
}

// start returns the job sending the effect of ev on t: the one in flight
// in this process if any (a redelivery while the first delivery's send goes
// on), else a new one.
func (n *Notifier) start(ev *contract.Event, traceParent string, t *target, writable func() bool) *job {
	effect := contract.EffectID(t.effect, ev.ID)
	n.mu.Lock()
	defer n.mu.Unlock()
	if j, ok := n.inflight[effect]; ok {
		return j
	}
	j := &job{effect: effect, target: t, ev: ev, trace: traceParent, writable: writable, done: make(chan struct{})}
	n.inflight[effect] = j
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		out := n.deliver(j)
		n.mu.Lock()
		delete(n.inflight, effect)
		j.out = out
		n.mu.Unlock()
		close(j.done)
	}()
	return j
}

var (
	errStopping    = errors.New("notifier: stopping")
	errNotWritable = errors.New("notifier: this instance's lease term has ended or lapsed: the event is the next writer's")
)

// deliver makes one attempt of an effect, if one is due: claim, send, mark.
func (n *Notifier) deliver(j *job) outcome {
	select {
	case j.target.slots <- struct{}{}:
	case <-n.stopping:
		return outcome{kind: storeFailed, err: errStopping}
	}
	defer func() { <-j.target.slots }()
	// A job that waited for its slot past the end of the lease term (the
	// instance cut off from NATS, another one taking over) sends nothing:
	// the event is the next writer's. (Should this instance hold a term
	// again by then, it sends: the claim stops a second send.)
	if !j.writable() {
		return outcome{kind: later, after: n.cfg.RetryMin, err: errNotWritable}
	}
	c, o := n.claim(j)
	if o != nil {
		return *o
	}
	if !c.sent {
		n.testHook("claimed", j.effect)
		body, err := encodeNotification(j.effect, j.ev)
		if err == nil {
			inFlight := n.metrics.InFlight.WithLabelValues(j.target.name)
			inFlight.Inc()
			err = n.post(telemetry.WithTraceParent(context.Background(), j.trace), j.target, j.effect, j.ev, body, c.attempt)
			inFlight.Dec()
		}
		n.testHook("sent", j.effect)
		if err != nil {
			return n.markFailed(j, c, err)
		}
		n.metrics.Sent.WithLabelValues(j.target.name).Inc()
	}
	return n.markSent(j, c)
}

func (n *Notifier) testHook(stage string, effect uuid.UUID) {
	if n.hook != nil {
		n.hook(stage, effect)
	}
}

// settle is the result of an event from the outcomes of its effects: the
// dedup store's failure first (retried in place), then an effect to retry
// (the event is redelivered when the earliest is due), then a dead effect
// (the event is dead-lettered).
func (n *Notifier) settle(ev *contract.Event, jobs []*job, outs []outcome) projector.Result {
	var storeErrs, laterErrs, deadErrs []error
	var deadJobs []int
	after := time.Duration(-1)
	anySent := false
	for k, o := range outs {
		switch o.kind {
		case sent:
			anySent = true
		case duplicate:
		case later:
			laterErrs = append(laterErrs, o.err)
			if after < 0 || o.after < after {
				after = o.after
			}
		case dead:
			deadErrs = append(deadErrs, o.err)
			deadJobs = append(deadJobs, k)
		case storeFailed:
			storeErrs = append(storeErrs, o.err)
		}
	}
	switch {
	case len(storeErrs) > 0:
		return projector.Result{Err: joinErrors(storeErrs)}
	case len(laterErrs) > 0:
		return projector.Result{Err: projector.Redeliver(joinErrors(laterErrs), after)}
	case len(deadErrs) > 0:
		for _, k := range deadJobs {
			if err := n.reset(jobs[k], outs[k].rev); err != nil {
				return projector.Result{Err: err}
			}
		}
		return projector.Result{Err: projector.DeadLetter(DeadLetterCode,
			fmt.Errorf("version %d of %q not notified: %w", ev.Version, ev.Key, joinErrors(deadErrs)))}
	case anySent:
		return projector.Result{Outcome: projector.Applied}
	default:
		return projector.Result{Outcome: projector.Skipped}
	}
}

// multiError joins errors on one line (a dead letter's reason is a header).
type multiError []error

func (m multiError) Error() string {
	msgs := make([]string, len(m))
	for i, err := range m {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (m multiError) Unwrap() []error { return m }

func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return multiError(errs)
}
