//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/projector/projectortest"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// TestPartitionsTakeOver runs the graph projector on Neo4j as three
// processes under load, one writing and two standing by, and moves them to
// four partitions as an operator would: the partitioned stream applied,
// then each instance restarted with -partitions, one after the other.
// The partitions spread over the three; the one holding most is
// SIGKILLed, and the other two take its partitions within the lease's
// bound, with everything committed before the kill applied soon after;
// started again, it gets its share back. The graph is then rebuilt in
// place, under load, asked of one of the instances, and then again with
// its coordinator SIGKILLed mid-rebuild. Last, a document of one
// partition is corrupted in Neo4j past every writer (a version no event
// has), and that partition alone is rebuilt under load: its documents are
// wiped and filled again. At the end converge verify agrees, every
// consumer has drained, and nothing acknowledged is lost.
func TestPartitionsTakeOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every service as a process of its own, with faults")
	}
	t.Parallel()
	const parts = 4
	cfg := configFromFlags()
	cfg.partitions, cfg.neo4j = parts, testenv.LeaseNeo4j(t)
	cfg.rate, cfg.docs = 200, 1000 // a graph whose rebuild lasts long enough to kill its coordinator in the middle
	p := startPipeline(t, cfg)
	ctx := context.Background()
	l, stopLoad := p.startLoad(ctx, cfg)
	defer stopLoad()
	instances := []*service{p.service("projector-graph"), p.service("projector-graph-b"), p.service("projector-graph-c")}
	byAddr := map[string]*service{}
	for _, s := range instances {
		byAddr[s.addr] = s
	}
	// held is which instance holds each partition (by its metrics
	// address, the end of its default holder name).
	holderOf := func(key string) *service {
		h := projectortest.LeaseHolder(ctx, p.js, key)
		for addr, s := range byAddr {
			if h != "" && strings.HasSuffix(h, "/"+addr) {
				return s
			}
		}
		return nil
	}
	held := func() map[int]*service {
		got := map[int]*service{}
		for part := range parts {
			if s := holderOf(projector.PartitionLease("graph", part)); s != nil && s.running() {
				got[part] = s
			}
		}
		return got
	}
	spread := func(want ...*service) bool {
		h := held()
		if len(h) != parts {
			return false
		}
		holding := map[*service]bool{}
		for _, s := range h {
			holding[s] = true
		}
		for _, s := range want {
			if !holding[s] {
				return false
			}
		}
		return len(holding) == len(want)
	}
	describe := func() string {
		h := held()
		var b strings.Builder
		for _, part := range slices.Sorted(maps.Keys(h)) {
			fmt.Fprintf(&b, " p%d:%s", part, h[part].name)
		}
		return b.String()
	}
	testenv.Eventually(t, "one instance writing", time.Minute, func() bool {
		return p.ackFloor(ctx, contract.DocsStream, "graph") > 0
	})
	time.Sleep(2 * time.Second) // load flows to the one writer

	// The move.
	sc := relay.StreamConfig{MaxMsgsPerSubject: int64(cfg.history)}
	if _, err := relay.ApplyPartsStream(ctx, p.js, sc, parts, false); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	lastBefore := p.lastSeq(ctx, contract.DocsStream)
	for _, s := range instances {
		s.kill()
		s.setArgs(append(s.argsNow(), "-partitions", fmt.Sprint(parts)))
		s.start()
	}
	testenv.Eventually(t, "the partitions spread over the three instances", time.Minute, func() bool { return spread(instances...) })
	moved := time.Since(at)
	var th verify.Thresholds
	testenv.Eventually(t, "the partitioned stream to copy everything committed before the move", time.Minute, func() bool {
		got, ok, ready, err := verify.PartitionThresholds(ctx, p.js, "graph", lastBefore)
		th = got
		return err == nil && ok && ready
	})
	testenv.Eventually(t, "everything committed before the move applied", 2*time.Minute, func() bool {
		done, err := verify.PartitionsAcknowledged(ctx, p.js, "graph", th)
		return err == nil && done
	})
	t.Logf("moved to %d partitions: spread over the three instances %s after the first restart, everything before it applied %s after; partitions:%s",
		parts, short(moved), short(time.Since(at)), describe())
	if _, err := p.js.Consumer(ctx, contract.DocsStream, "graph"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the one writer's consumer after the move: %v, want it deleted", err)
	}
	time.Sleep(2 * time.Second) // load flows to every partition

	// The instance holding most partitions, SIGKILLed.
	count := map[*service]int{}
	for _, s := range held() {
		count[s]++
	}
	victim := instances[0]
	for _, s := range instances {
		if count[s] > count[victim] {
			victim = s
		}
	}
	var others []*service
	for _, s := range instances {
		if s != victim {
			others = append(others, s)
		}
	}
	lasts := p.partitionLasts(ctx, parts)
	at = time.Now()
	victim.kill()
	testenv.Eventually(t, "the others to take the killed instance's partitions", 30*time.Second, func() bool { return spread(others...) })
	toWriters := time.Since(at)
	testenv.Eventually(t, "everything committed before the kill applied", 2*time.Minute, func() bool {
		for part, last := range lasts {
			if p.ackFloor(ctx, contract.PartsStream, contract.PartitionName("graph", part)) < last {
				return false
			}
		}
		return true
	})
	toDone := time.Since(at)
	t.Logf("SIGKILL %s (%d partitions): the others hold every partition after %s (lease TTL %v), everything before the kill applied after %s; partitions:%s",
		victim.name, count[victim], short(toWriters), standbyTTL, short(toDone), describe())
	if toWriters > 5*standbyTTL {
		t.Errorf("the killed instance's partitions were taken after %v, beyond the lease's bound (%v and a poll)", toWriters, standbyTTL)
	}

	victim.start()
	at = time.Now()
	testenv.Eventually(t, "the restarted instance to get its share back", time.Minute, func() bool { return spread(instances...) })
	t.Logf("%s restarted: back to three instances after %s; partitions:%s", victim.name, short(time.Since(at)), describe())

	// A rebuild in place (Neo4j holds one graph) under load, asked of one
	// instance: whichever coordinates takes every partition, wipes and
	// fills the graph, and hands the partitions back.
	c := &rebuild.Client{Addr: others[0].addr, Token: p.operatorToken}
	var st rebuild.Status
	testenv.Eventually(t, "a rebuild to start", 30*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = c.Start(ctx)
		if err != nil {
			t.Logf("starting a rebuild: %v", err)
		}
		return err == nil && started
	})
	at = time.Now()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.Wait(wctx, st.ID, 200*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	rebuilt := time.Since(at)
	testenv.Eventually(t, "the partitions spread again after the rebuild", time.Minute, func() bool { return spread(instances...) })
	t.Logf("rebuilt in place, asked of %s, in %s; spread again %s after it began; partitions:%s", others[0].name, short(rebuilt), short(time.Since(at)), describe())

	// Again, the coordinator SIGKILLed while it fills the graph: another
	// instance takes the coordinator's lease and finishes the rebuild, the
	// dead one's claim on every partition gone with its members' key.
	var coord *service
	testenv.Eventually(t, "an instance to coordinate the rebuilds", 30*time.Second, func() bool {
		coord = holderOf(projector.CoordinatorLease("graph"))
		return coord != nil
	})
	asked := instances[0]
	if asked == coord {
		asked = instances[1]
	}
	c = &rebuild.Client{Addr: asked.addr, Token: p.operatorToken}
	testenv.Eventually(t, "a second rebuild to start", 30*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = c.Start(ctx)
		return err == nil && started
	})
	var during rebuild.Status
	testenv.Eventually(t, "the second rebuild to be filling the graph", time.Minute, func() bool {
		var err error
		during, err = c.Status(ctx)
		return err == nil && (during.Phase == rebuild.PhaseFilling && during.AppliedSeq > 0 || during.Phase == rebuild.PhaseDone)
	})
	if during.Phase == rebuild.PhaseDone || during.Pending == 0 {
		t.Fatalf("the rebuild was done before its coordinator could be killed: %+v", during)
	}
	at = time.Now()
	coord.kill()
	if _, err := c.Wait(wctx, st.ID, 200*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	resumed := time.Since(at)

	coord.start()
	testenv.Eventually(t, "the partitions spread again after the second rebuild", time.Minute, func() bool { return spread(instances...) })
	t.Logf("SIGKILL of the coordinator %s while it filled the graph (applied %d, pending %d): the rebuild finished by another %s later (lease TTL %v); spread again after %s; partitions:%s",
		coord.name, during.AppliedSeq, during.Pending, short(resumed), standbyTTL, short(time.Since(at)), describe())

	// One partition rebuilt alone, under load, after one of its
	// documents was corrupted: the live writer skips every event of it
	// from then on (its stored version is ahead of them all), so only the
	// partition's wipe and fill make the final verify agree.
	const part = 2
	corrupted := corruptDocument(t, cfg.neo4j, parts, part)
	c = &rebuild.Client{Addr: instances[2].addr, Token: p.operatorToken}
	testenv.Eventually(t, "a rebuild of partition 2 to start", 30*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = c.StartPartition(ctx, part)
		if err != nil {
			t.Logf("starting a rebuild of partition %d: %v", part, err)
		}
		return err == nil && started
	})
	at = time.Now()
	if _, err := c.Wait(wctx, st.ID, 200*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the partitions spread again after the partition's rebuild", time.Minute, func() bool { return spread(instances...) })
	t.Logf("partition %d of %d rebuilt alone (document %s corrupted before) in %s; partitions:%s", part, parts, corrupted, short(time.Since(at)), describe())

	stopLoad()
	p.checkAfterLoad(ctx, l)
	if dead := p.deadLetters(ctx); dead > 0 {
		t.Errorf("%d dead letters", dead)
	}
}

// corruptDocument gives a document of partition part, in the graph of
// Neo4j n, a version and title no event of it has, past every writer, and
// returns its key.
func corruptDocument(t *testing.T, n testenv.Neo4j, parts, part int) string {
	t.Helper()
	ctx := context.Background()
	d, err := neo4j.NewDriverWithContext(n.URL, neo4j.BasicAuth(n.User, n.Password, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close(ctx) }()
	res, err := neo4j.ExecuteQuery(ctx, d, "MATCH (d:Document) WHERE d.version IS NOT NULL RETURN d.key AS key LIMIT 1000", nil, neo4j.EagerResultTransformer)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		key, _ := r.Get("key")
		k, _ := key.(string)
		if contract.Partition(k, parts) != part {
			continue
		}
		if _, err := neo4j.ExecuteQuery(ctx, d, "MATCH (d:Document {key: $key}) SET d.version = 1000000000000, d.title = 'corrupted'",
			map[string]any{"key": k}, neo4j.EagerResultTransformer); err != nil {
			t.Fatal(err)
		}
		return k
	}
	t.Fatalf("no document of partition %d among %d in the graph", part, len(res.Records))
	return ""
}

// partitionLasts is the last sequence of each partition's subjects in the
// partitioned stream (none: 0).
func (p *pipeline) partitionLasts(ctx context.Context, parts int) map[int]uint64 {
	s, err := p.js.Stream(ctx, contract.PartsStream)
	if err != nil {
		p.t.Fatal(err)
	}
	lasts := map[int]uint64{}
	for part := range parts {
		m, err := s.GetLastMsgForSubject(ctx, contract.PartitionSubjectPrefix(part)+">")
		switch {
		case err == nil:
			lasts[part] = m.Sequence
		case errors.Is(err, jetstream.ErrMsgNotFound):
		default:
			p.t.Fatalf("last message of partition %d: %v", part, err)
		}
	}
	return lasts
}
