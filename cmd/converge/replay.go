package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// replay moves a projector's durable consumer back to a stream sequence or
// a time. The projector, running or not, then receives every event from
// there again; its stores skip what they already hold (version markers), so
// a replay has no duplicate effects.
func replay(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge replay")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	stream := f.String("stream", "", contract.DocsStream, "the projectors' stream")
	fromSeq := f.Int("from-seq", "", 0, "replay from this stream sequence (1: everything)")
	fromTime := f.String("from-time", "", "", "replay from this time (RFC 3339, e.g. 2026-11-30T10:00:00Z)")
	natsAuth := natsauth.Flags(f)
	names, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(names) != 1 {
		return errors.New("replay needs one projector (its consumer name, e.g. index or graph): converge replay index --from-seq 1")
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	var start time.Time
	switch {
	case *fromSeq > 0 && *fromTime != "":
		return errors.New("replay: give --from-seq or --from-time, not both")
	case *fromSeq < 0:
		return errors.New("replay: --from-seq must be 1 or more")
	case *fromTime != "":
		t, err := time.Parse(time.RFC3339, *fromTime)
		if err != nil {
			return fmt.Errorf("replay: --from-time: %w", err)
		}
		start = t
	case *fromSeq == 0:
		return errors.New("replay: give --from-seq N or --from-time T")
	}
	nc, js, err := connectJetStream(*natsURL, "converge-replay", natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	pending, err := projector.Replay(ctx, js, *stream, names[0], projector.ReplayFrom{Seq: uint64(*fromSeq), Time: start})
	if err != nil {
		return err
	}
	from := fmt.Sprintf("sequence %d", *fromSeq)
	if !start.IsZero() {
		from = start.Format(time.RFC3339)
	}
	fmt.Fprintf(out, "consumer %s of %s now delivers from %s: %d events to redeliver\n", names[0], *stream, from, pending)
	return nil
}
