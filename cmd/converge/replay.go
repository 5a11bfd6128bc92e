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
	partitions := f.Int("partitions", config.EnvPartitions, 0, "the projector runs in this many partitions: replay each partition's consumer on "+contract.PartsStream+" (its sequences are that stream's)")
	partition := f.Int("partition", "", -1, "with -partitions: replay this partition alone")
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
	from := fmt.Sprintf("sequence %d", *fromSeq)
	if !start.IsZero() {
		from = start.Format(time.RFC3339)
	}
	consumers := []string{names[0]}
	switch {
	case *partitions > 1:
		if *stream != contract.DocsStream {
			return fmt.Errorf("replay: -stream %s with -partitions: a projector's partitions are on %s", *stream, contract.PartsStream)
		}
		*stream = contract.PartsStream
		consumers = nil
		for p := range *partitions {
			if *partition < 0 || *partition == p {
				consumers = append(consumers, contract.PartitionName(names[0], p))
			}
		}
		if len(consumers) == 0 {
			return fmt.Errorf("replay: -partition %d: the partitions are 0 to %d", *partition, *partitions-1)
		}
	case *partition >= 0:
		return errors.New("replay: -partition needs -partitions (the projector's number of partitions)")
	}
	for _, c := range consumers {
		pending, err := projector.Replay(ctx, js, *stream, c, projector.ReplayFrom{Seq: uint64(*fromSeq), Time: start})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "consumer %s of %s now delivers from %s: %d events to redeliver\n", c, *stream, from, pending)
	}
	return nil
}
