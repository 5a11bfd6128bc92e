package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/pkg/contract"
)

// streamsCmd is `converge streams apply`: create the streams and the
// shared buckets, or bring them to their settings, as the operator. The
// services create them when they are absent and never change them (NATS
// gives them no right to): a change of the relay's stream settings takes
// this command, with the same flags (and environment) as the relay.
func streamsCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "apply" {
		return service.Usage("streams needs a subcommand: apply -nats-url URL [the relay's stream flags: -stream-history, -effects, ...]")
	}
	f := config.NewFlags("converge streams apply")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "NATS URL")
	streams := relay.StreamFlags(f)
	partitions := f.Int("partitions", config.EnvPartitions, 0,
		"also create the partitioned stream "+contract.PartsStream+" of this many partitions (2 to 16), which the projectors started with the same -partitions consume; 0: leave it as it is")
	effectsPartitions := f.Int("effects-partitions", notifier.EnvPartitions, 0,
		"with -effects: also create the effects' partitions (2 to 16), to which the relays then publish the effects and which the notifiers started with the same -partitions consume; 0: leave them as they are")
	repartition := f.Bool("repartition", "", false, "with -partitions: make the partitioned stream anew when it has another number of partitions (stop every partitioned projector first); with -effects-partitions, the same of the effects' partitions, which must be empty (stop the relays first)")
	natsAuth := natsauth.Flags(f)
	if err := f.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return service.Usage("streams apply: %w", err)
	}
	if f.NArg() > 0 {
		return service.Usage("streams apply: unexpected argument %q", f.Arg(0))
	}
	if err := config.Require(*natsURL, "nats-url", config.EnvNATSURL); err != nil {
		return err
	}
	cfg, err := streams()
	if err != nil {
		return service.Usage("streams apply: %w", err)
	}
	nc, js, err := connectJetStream(*natsURL, "converge-streams", natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	replicas := max(cfg.Stream.Replicas, 1)
	if _, err := relay.ApplyStream(ctx, js, cfg.Stream); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: applied\n", contract.DocsStream)
	if *partitions != 0 {
		res, err := relay.ApplyPartsStream(ctx, js, cfg.Stream, *partitions, *repartition)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: %s (%d partitions)\n", contract.PartsStream, res, *partitions)
	}
	if cfg.Effects.Enabled {
		// The effects' partitions: those of -effects-partitions, or those
		// the operator made before.
		n := *effectsPartitions
		if n == 0 {
			if n, err = relay.EffectsPartitions(ctx, js); err != nil {
				return err
			}
		}
		if n > 1 {
			res, err := relay.ApplyEffectsPartitions(ctx, js, cfg, n, *repartition)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: applied\n%s to %s: %s (%d partitions of the effects; the relays publish to them from their next session)\n",
				contract.RemovalsStream, contract.EventsPartitionStream(0), contract.EventsPartitionStream(n-1), res, n)
		} else {
			if _, err := relay.ApplyEffectsStream(ctx, js, cfg); err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: applied\n%s: applied\n", contract.RemovalsStream, contract.EventsStream)
		}
	} else {
		if *effectsPartitions != 0 {
			return service.Usage("streams apply: -effects-partitions %d needs -effects (%s)", *effectsPartitions, "CONVERGE_RELAY_EFFECTS=true")
		}
		fmt.Fprintf(out, "%s, %s: left as they are (without -effects)\n", contract.EventsStream, contract.RemovalsStream)
	}
	if err := deadletter.ApplyStream(ctx, js, replicas); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: applied\n", deadletter.Stream)
	for _, b := range []sharedkv.Config{lease.BucketConfig(replicas), rebuild.BucketConfig(replicas)} {
		if err := sharedkv.Apply(ctx, js, b); err != nil {
			return err
		}
		fmt.Fprintf(out, "bucket %s: applied (roll-ups refused)\n", b.Bucket)
	}
	return nil
}
