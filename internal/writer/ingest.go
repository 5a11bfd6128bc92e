package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// Names of the ingest path in JetStream.
const (
	IngestStream   = "CONVERGE_INGEST"
	IngestConsumer = "converge-writer"
	DLQStream      = deadletter.Stream
	// IngestDLQName names the ingest consumer's dead-letter subject,
	// converge.dlq.ingest.
	IngestDLQName = "ingest"
)

// Headers of a dead-lettered message (see package deadletter).
const (
	HeaderDLQReason  = deadletter.HeaderReason
	HeaderDLQCode    = deadletter.HeaderCode
	HeaderDLQSubject = deadletter.HeaderSubject
	HeaderDLQStream  = deadletter.HeaderStream
	HeaderDLQSeq     = deadletter.HeaderSeq
)

// IngestConfig of the ingest consumer.
type IngestConfig struct {
	BatchSize  int           // messages fetched and written per transaction; default 256
	MaxWait    time.Duration // how long a fetch waits for a full batch; default 200ms
	AckWait    time.Duration // redelivery timeout of an unacknowledged message; default 30s
	RetryDelay time.Duration // redelivery delay after a store failure; default 1s
	MaxAge     time.Duration // retention of unconsumed ingest messages; default 7 days
	Replicas   int           // stream replicas; default 1
}

// Default values of [IngestConfig]; the writer's -ack-wait defaults to
// DefaultIngestAckWait too.
const (
	DefaultIngestBatchSize  = 256
	DefaultIngestMaxWait    = 200 * time.Millisecond
	DefaultIngestAckWait    = 30 * time.Second
	DefaultIngestRetryDelay = time.Second
	DefaultIngestMaxAge     = 7 * 24 * time.Hour
	DefaultIngestReplicas   = config.DefaultReplicas
)

func (c *IngestConfig) setDefaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultIngestBatchSize
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultIngestMaxWait
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultIngestAckWait
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = DefaultIngestRetryDelay
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultIngestMaxAge
	}
	if c.Replicas <= 0 {
		c.Replicas = DefaultIngestReplicas
	}
}

// Ingest consumes documents from converge.ingest.<token> and stores them
// with the same semantics as the HTTP API.
type Ingest struct {
	js      jetstream.JetStream
	store   Store
	cfg     IngestConfig
	metrics *Metrics
	log     *slog.Logger
}

// NewIngest returns an ingest consumer; Run starts it.
func NewIngest(js jetstream.JetStream, store Store, cfg IngestConfig, metrics *Metrics, log *slog.Logger) *Ingest {
	cfg.setDefaults()
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Ingest{js: js, store: store, cfg: cfg, metrics: metrics, log: log}
}

// EnsureStreams creates or updates the ingest stream (work-queue retention:
// a message is removed once acknowledged) and the dead-letter stream.
func (in *Ingest) EnsureStreams(ctx context.Context) error {
	if _, err := in.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        IngestStream,
		Description: "documents from producers, consumed by the converge writer",
		Subjects:    []string{contract.IngestSubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    in.cfg.Replicas,
		MaxAge:      in.cfg.MaxAge,
	}); err != nil {
		return fmt.Errorf("writer: ensure stream %s: %w", IngestStream, err)
	}
	return EnsureDLQStream(ctx, in.js, in.cfg.Replicas)
}

// EnsureDLQStream creates or updates the stream that keeps every consumer's
// dead letters.
func EnsureDLQStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if err := deadletter.EnsureStream(ctx, js, replicas); err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	return nil
}

// Run consumes until ctx ends. A store failure is not fatal: the batch is
// negatively acknowledged with a delay and redelivered.
func (in *Ingest) Run(ctx context.Context) error {
	if err := in.EnsureStreams(ctx); err != nil {
		return err
	}
	cons, err := in.js.CreateOrUpdateConsumer(ctx, IngestStream, jetstream.ConsumerConfig{
		Durable:       IngestConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       in.cfg.AckWait,
		MaxAckPending: 4 * in.cfg.BatchSize,
	})
	if err != nil {
		return fmt.Errorf("writer: ensure consumer %s: %w", IngestConsumer, err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(in.cfg.BatchSize, jetstream.FetchMaxWait(in.cfg.MaxWait))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			in.log.WarnContext(ctx, "ingest fetch failed", "err", err)
			sleep(ctx, in.cfg.RetryDelay)
			continue
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			in.log.WarnContext(ctx, "ingest fetch ended early", "err", err)
		}
		if len(msgs) > 0 {
			in.handle(ctx, msgs)
		}
	}
	return nil
}

// handle stores a fetched batch. Order of effects: dead letters are
// published (and acknowledged by JetStream) first, then the valid documents
// are committed, then every message is acknowledged. A crash in between
// leaves messages unacknowledged, to be redelivered and written again
// idempotently.
func (in *Ingest) handle(ctx context.Context, msgs []jetstream.Msg) {
	var (
		writes []docstore.Write
		from   []jetstream.Msg
		done   []jetstream.Msg
	)
	for _, m := range msgs {
		wr, err := decodeIngest(m)
		if err != nil {
			if in.deadLetter(ctx, m, err) {
				done = append(done, m)
			}
			continue
		}
		// A producer's trace continues through the queue path too.
		if h := m.Headers(); h != nil {
			wr.TraceParent = telemetry.TraceParent(telemetry.WithTraceParent(ctx, h.Get("traceparent"))) // "" unless valid
		}
		writes = append(writes, wr)
		from = append(from, m)
	}
	if len(writes) > 0 {
		done = append(done, in.apply(ctx, writes, from)...)
	}
	for _, m := range done {
		if err := m.Ack(); err != nil {
			in.log.WarnContext(ctx, "ingest ack failed; the message will be redelivered and written again idempotently", "err", err)
		}
	}
}

// apply stores writes and returns the messages that may be acknowledged:
// stored, or dead-lettered. A transient failure leaves them all for
// redelivery.
func (in *Ingest) apply(ctx context.Context, writes []docstore.Write, from []jetstream.Msg) []jetstream.Msg {
	start := time.Now()
	outs, err := applyIsolating(ctx, in.store, writes)
	in.metrics.TxSeconds.WithLabelValues("ingest").Observe(time.Since(start).Seconds())
	if err != nil {
		in.log.ErrorContext(ctx, "ingest write failed; messages will be redelivered", "messages", len(writes), "err", err)
		for _, m := range from {
			_ = m.NakWithDelay(in.cfg.RetryDelay)
		}
		return nil
	}
	in.metrics.count("ingest", outs)
	var done []jetstream.Msg
	for i, o := range outs {
		if o.Err != nil {
			// A conflict, an invalid document or data the database
			// rejects can never apply.
			if in.deadLetter(ctx, from[i], o.Err) {
				done = append(done, from[i])
			}
			continue
		}
		done = append(done, from[i])
	}
	return done
}

// applyIsolating stores writes in one transaction. When the database
// rejects the data of some document (a permanent error that every retry of
// the whole batch would meet again), the batch is split until the rejected
// writes are isolated: they get the error in their outcome, the others are
// stored. The returned error is for transient failures only, in which case
// nothing was stored.
func applyIsolating(ctx context.Context, store Store, writes []docstore.Write) ([]docstore.Outcome, error) {
	outs, err := store.Apply(ctx, writes)
	switch {
	case err == nil:
		return outs, nil
	case !permanent(err):
		return nil, err
	case len(writes) == 1:
		return []docstore.Outcome{{Key: writes[0].Doc.Key, Version: writes[0].Doc.Version, Err: err}}, nil
	}
	mid := len(writes) / 2
	left, err := applyIsolating(ctx, store, writes[:mid])
	if err != nil {
		return nil, err
	}
	right, err := applyIsolating(ctx, store, writes[mid:])
	if err != nil {
		return nil, err
	}
	return append(left, right...), nil
}

// permanent reports an error the same data will meet again however often
// it is retried: Postgres rejecting the data itself (class 22, data
// exception; class 23, integrity constraint violation).
func permanent(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}

func decodeIngest(m jetstream.Msg) (docstore.Write, error) {
	wr, err := decodeWrite(m.Data(), "", true)
	if err != nil {
		return wr, err
	}
	// Subjects are keyed by document identity; a document on another
	// document's subject would lose its ordering guarantee.
	if want := contract.IngestSubject(wr.Doc.Key); m.Subject() != want {
		return wr, &contract.ValidationError{Code: "subject_mismatch",
			Message: fmt.Sprintf("document %q was published on %s, its subject is %s", wr.Doc.Key, m.Subject(), want)}
	}
	return wr, nil
}

// deadLetter publishes m to converge.dlq.ingest with the reason, waiting for
// JetStream's acknowledgement. It reports whether the original may now be
// acknowledged; if the dead letter could not be stored the original is left
// for redelivery, so it never vanishes.
func (in *Ingest) deadLetter(ctx context.Context, m jetstream.Msg, reason error) bool {
	_, code := errorStatus(reason)
	var ve *contract.ValidationError
	if errors.As(reason, &ve) {
		code = ve.Code
	}
	if err := deadletter.Publish(ctx, in.js, IngestDLQName, m, code, reason, in.cfg.RetryDelay); err != nil {
		in.log.ErrorContext(ctx, "dead-letter publish failed; message left for redelivery", "subject", m.Subject(), "err", err)
		return false
	}
	in.metrics.DeadLetter.WithLabelValues(code).Inc()
	in.log.WarnContext(ctx, "ingest message dead-lettered", "subject", m.Subject(), "code", code, "reason", reason)
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
