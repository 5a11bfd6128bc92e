//go:build linux

package notifier

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// partitionsChild, followed by the instance's name, is the value of
// childEnv that makes the test binary run a partitioned notifier service.
const partitionsChild = "partitions:"

// crashParts and crashLeaseTTL are the partitioned children's partitions
// and lease TTL.
const (
	crashParts    = 4
	crashLeaseTTL = time.Second
)

// runPartitionsChild runs the notifier service, as the notifier command
// does, as instance holder of a deployment in crashParts partitions, until
// it is killed.
func runPartitionsChild(holder string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("instance", holder)
	rc := crashRuntime(crashConsumer)
	rc.EveryEvent = false // set by the service
	cfg := ServiceConfig{
		Projector: projector.ServiceConfig{NATSURL: os.Getenv("CONVERGE_NATS_URL"), Partitions: crashParts, Runtime: rc,
			Lease: projector.LeaseConfig{TTL: crashLeaseTTL, Holder: holder}},
		Notifier: crashConfig(strings.Split(os.Getenv(EnvWebhookURLs), ",")),
	}
	cfg.Notifier.Owner = holder
	if err := service.Run(context.Background(), cfg, log, Run); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// notifierHolders reads who holds each of the notifier's partitions.
func notifierHolders(e *env) map[int]string {
	got := map[int]string{}
	for p := range crashParts {
		if h := projectortest.LeaseHolder(context.Background(), e.js, projector.PartitionLease(crashConsumer, p)); h != "" {
			got[p] = h
		}
	}
	return got
}

// Two partitioned notifier processes share the effects; one is SIGKILLed
// while events keep coming: the other takes its partitions over once
// their leases expire, and every event is notified, none reported
// missed. An effect the dead one sent without marking it is sent again,
// with the same Idempotency-Key.
func TestPartitionedNotifierKilledUnderLoad(t *testing.T) {
	e := newBareEnv(t)
	if _, err := relay.ApplyEffectsPartitions(context.Background(), e.js, relay.Config{Effects: relay.EffectsConfig{Enabled: true}}, crashParts, false); err != nil {
		t.Fatal(err)
	}
	e.relayMoved(crashParts)
	rcv := newReceiver(t)
	urls := []string{rcv.url("/hook")}
	startChild(t, e, partitionsChild+"a", urls)
	testenv.Eventually(t, "a to hold every partition", 30*time.Second, func() bool {
		h := notifierHolders(e)
		return len(h) == crashParts && h[0] == "a" && h[1] == "a" && h[2] == "a" && h[3] == "a"
	})
	b := startChild(t, e, partitionsChild+"b", urls)
	var bHeld []int
	testenv.Eventually(t, "b to take its share", 30*time.Second, func() bool {
		bHeld = nil
		h := notifierHolders(e)
		for p, who := range h {
			if who == "b" {
				bHeld = append(bHeld, p)
			}
		}
		return len(h) == crashParts && len(bHeld) == crashParts/2
	})

	const events = 600
	var published atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range events {
			e.partitionPublish(upsert(fmt.Sprintf("doc-%03d", i%150), int64(1+i/150)), crashParts)
			published.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	testenv.Eventually(t, "a third of the events published", 30*time.Second, func() bool { return published.Load() >= events/3 })
	b.kill(t)
	killed := time.Now()
	testenv.Eventually(t, "a to take b's partitions over", 30*time.Second, func() bool {
		h := notifierHolders(e)
		for _, p := range bHeld {
			if h[p] != "a" {
				return false
			}
		}
		return true
	})
	took := time.Since(killed)
	<-done
	testenv.Eventually(t, "every event notified", 60*time.Second, func() bool { return len(rcv.received()) == events })
	t.Logf("b's %d partitions taken over %v after its SIGKILL (lease TTL %v)", len(bHeld), took.Round(10*time.Millisecond), crashLeaseTTL)
	if bound := 5 * crashLeaseTTL; took > bound {
		t.Errorf("takeover took %v, beyond %v", took, bound)
	}
	again := 0
	for _, n := range rcv.check() { // every request carries its effect's key
		if n > 1 {
			again++
		}
	}
	t.Logf("%d of %d effects sent more than once (sent by b, not marked before its death: same key)", again, events)
	if inFlight := len(bHeld) * 4 * crashRuntime(crashConsumer).BatchSize; again > inFlight { // MaxAckPending per partition
		t.Errorf("%d effects sent again: more than b's %d partitions could hold in flight (%d)", again, len(bHeld), inFlight)
	}
	for p := range crashParts {
		if rec, ok := e.gapRecord(contract.EventsPartitionStream(p), contract.PartitionName(crashConsumer, p)); ok && rec.Missed != 0 {
			t.Errorf("partition %d reported %d events missed: %+v", p, rec.Missed, rec)
		}
	}
}
