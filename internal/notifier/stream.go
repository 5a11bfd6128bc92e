package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// RuntimeConfig is c made the notifier's: it consumes the effects' stream
// (contract.EventsStream, which keeps every event until the notifier
// acknowledged it) and is handed every event, several versions of one
// document included (projector.Config.EveryEvent), reporting any event it
// never received as missed, those the stream's limits removed while it held
// them unacknowledged from the server's record of each
// (contract.RemovalsStream).
func RuntimeConfig(c projector.Config) projector.Config {
	c.Stream = contract.EventsStream
	c.SubjectPrefix = contract.EventsSubjectPrefix
	c.EveryEvent = true
	c.Removals = contract.RemovalsStream
	return c
}

// StreamWait is how often [WaitForStream] looks for the effects' stream.
var StreamWait = time.Second

// WaitForStream waits until the effects' stream exists (the relay creates
// it when it runs with -effects), saying at once, and then every minute,
// what is missing; it warns when the stream's age limit is shorter than
// the window, since events would then leave it before the notifier is
// bound to notify them.
func WaitForStream(ctx context.Context, js jetstream.JetStream, window time.Duration, log *slog.Logger) (*jetstream.StreamInfo, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var said time.Time
	for {
		s, err := js.Stream(ctx, contract.EventsStream)
		if err == nil {
			info := s.CachedInfo()
			if info.Config.Retention != jetstream.WorkQueuePolicy {
				return nil, fmt.Errorf("notifier: stream %s has %v retention, not a work queue: it is not the relay's effects' stream", contract.EventsStream, info.Config.Retention)
			}
			if age := info.Config.MaxAge; age > 0 && age < window {
				log.Warn("the effects' stream keeps events for less than the notifier's window: an event not notified within its max age leaves the stream and is reported missed; give the relay -effects-max-age of the window",
					"stream", contract.EventsStream, "max_age", age, "window", window)
			}
			return info, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			log.Warn("reading the effects' stream failed; retrying", "stream", contract.EventsStream, "err", err)
		} else if time.Since(said) >= time.Minute {
			log.Error("waiting for the effects' stream: the relay creates it when it runs with -effects (CONVERGE_RELAY_EFFECTS=true); until then nothing is notified",
				"stream", contract.EventsStream)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(StreamWait):
		}
	}
}

// Migrate finishes the notifier's consumer of the documents' stream, the
// one an older deployment used (named like rc.Name, on CONVERGE_DOCS),
// when there is one: it notifies, through n, every event of it up to the
// sequence that the documents' stream had when the effects' stream was
// created (info's contract.MetaEventsDocsSeq; every later event is in the
// effects' stream too), then deletes it. An event in both streams is sent
// once: both name the same effects, which the dedup store knows. It
// returns the number of events the old consumer still had to deliver (0
// when there was none).
func Migrate(ctx context.Context, js jetstream.JetStream, n *Notifier, rc projector.Config, info *jetstream.StreamInfo, log *slog.Logger) (uint64, error) {
	old, err := js.Consumer(ctx, contract.DocsStream, rc.Name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("notifier: the consumer %s of %s: %w", rc.Name, contract.DocsStream, err)
	}
	raw, ok := info.Config.Metadata[contract.MetaEventsDocsSeq]
	until, perr := strconv.ParseUint(raw, 10, 64)
	if !ok || perr != nil {
		return 0, fmt.Errorf("notifier: stream %s does not say where in %s it began (metadata %s is %q), so the consumer %s of %s cannot be finished safely: once it has nothing pending, delete it (nats consumer rm %s %s)",
			contract.EventsStream, contract.DocsStream, contract.MetaEventsDocsSeq, raw, rc.Name, contract.DocsStream, contract.DocsStream, rc.Name)
	}
	oi := old.CachedInfo()
	left := uint64(0)
	if oi.AckFloor.Stream < until {
		left = until - oi.AckFloor.Stream
	}
	log.Info("moving from the documents' stream to the effects' stream: finishing the old consumer first",
		"consumer", rc.Name, "from", contract.DocsStream, "to", contract.EventsStream,
		"ack_floor", oi.AckFloor.Stream, "until_seq", until, "pending", oi.NumPending+uint64(oi.NumAckPending))
	if oi.AckFloor.Stream < until && oi.NumPending+uint64(oi.NumAckPending) > 0 {
		dc := rc
		dc.Stream, dc.SubjectPrefix, dc.EveryEvent = contract.DocsStream, contract.DocsSubjectPrefix, true
		dc.Removals = "" // the removals' stream records the effects' stream only
		dc.StopAtSeq = until
		r, err := projector.New(js, n, dc, nil, log)
		if err != nil {
			return 0, err
		}
		if err := r.Run(ctx); err != nil {
			return 0, fmt.Errorf("notifier: finishing the consumer %s of %s: %w", rc.Name, contract.DocsStream, err)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	if err := js.DeleteConsumer(ctx, contract.DocsStream, rc.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, fmt.Errorf("notifier: delete the finished consumer %s of %s: %w", rc.Name, contract.DocsStream, err)
	}
	log.Info("moved to the effects' stream: the old consumer is finished and deleted", "consumer", rc.Name,
		"stream", contract.DocsStream, "events_left_then", left)
	return left, nil
}
