//go:build linux

package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// TestNATSClusterLosesItsStreamLeader runs the pipeline on a cluster of
// three NATS servers, every stream and bucket with three replicas, under
// load. It SIGKILLs the server leading the documents' stream, measures the
// pause (until every service is ready, a write is acknowledged and the
// stream grows again, with two servers left), restarts it on its store,
// and (the long form) does the same to the next leader. At the end nothing acknowledged is
// lost, the stream and the outbox agree, converge verify agrees, every
// event was notified, and converge status shows the replicas and the
// leader.
func TestNATSClusterLosesItsStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("the NATS cluster suite starts three servers and every service")
	}
	// A pipeline of its own (Postgres cluster, NATS servers, receiver,
	// temporary directories): it runs beside TestStandbyTakesOver, both
	// mostly waiting (for leases, a leader's election, a relay's
	// readiness).
	t.Parallel()
	// The short form, in make test, kills one leader; the long one
	// (CONVERGE_TEST_CLUSTER=1, make test-ha) kills the leader, restarts
	// it, and kills the next one.
	kills := 1
	if os.Getenv("CONVERGE_TEST_CLUSTER") != "" {
		kills = 2
	}
	cfg := configFromFlags()
	cfg.cluster = true
	cfg.rate = 200
	p := startPipeline(t, cfg)
	ctx := context.Background()
	l, stopLoad := p.startLoad(ctx, cfg)
	defer stopLoad()
	tapCtx, stopTap := context.WithCancel(ctx)
	defer stopTap()
	docsTap, tapDone := p.startTap(tapCtx, contract.DocsStream)

	var faults []*fault
	killed := map[string]bool{}
	for n := 1; n <= kills; n++ {
		time.Sleep(3 * time.Second)
		info, err := p.streamInfo(ctx, contract.DocsStream)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" {
			t.Fatalf("%s: %d replicas, cluster %+v; want 3 replicas and a leader", contract.DocsStream, info.Config.Replicas, info.Cluster)
		}
		leader := info.Cluster.Leader
		if killed[leader] {
			t.Logf("the leader %s was killed before: the stream moved back to it", leader)
		}
		killed[leader] = true
		node := p.cluster.Node(leader)
		f := &fault{N: n, Kind: "SIGKILL stream leader", Start: time.Now()}
		node.Kill()
		f.End = f.Start
		p.recovered(ctx, f, l, 2*time.Minute)
		after, err := p.streamInfo(ctx, contract.DocsStream)
		newLeader := "?"
		if err == nil && after.Cluster != nil {
			newLeader = after.Cluster.Leader
		}
		f.Detail = fmt.Sprintf("%s killed; %s leads", leader, newLeader)
		t.Logf("fault %d %-22s %-26s ready %6s (last: %s)  writes %6s  stream %6s  %s", n, f.Kind, f.Detail,
			short(f.Ready), f.Slowest, short(f.Writes), short(f.Stream), f.Failed)
		if f.Failed != "" {
			t.Fatalf("fault %d (%s): %s", n, f.Detail, f.Failed)
		}
		if newLeader == leader {
			t.Errorf("the stream is led by %s, the server killed", leader)
		}
		restart := time.Now()
		if err := node.Start(); err != nil {
			t.Fatalf("restart %s: %v", leader, err)
		}
		testenv.Eventually(t, leader+" to be a current replica again", 2*time.Minute, func() bool {
			info, err := p.streamInfo(ctx, contract.DocsStream)
			if err != nil || info.Cluster == nil {
				return false
			}
			for _, r := range info.Cluster.Replicas {
				if r.Name == leader {
					return r.Current && !r.Offline
				}
			}
			return info.Cluster.Leader == leader
		})
		t.Logf("fault %d: %s restarted on its store and current again after %s", n, leader, short(time.Since(restart)))
		faults = append(faults, f)
	}

	stopLoad()
	loadEnd := time.Now()
	for _, s := range p.services {
		testenv.Eventually(t, s.name+" to be ready after the load", 2*time.Minute, s.ready)
	}
	toVerify, out, err := p.verifyAgrees(ctx, loadEnd, 2*time.Minute)
	if err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	toDrain, err := p.drained(ctx, loadEnd, 2*time.Minute)
	if err != nil {
		t.Error(err)
		// Where each service is stuck: a goroutine dump in its log.
		for _, s := range p.services {
			s.dumpGoroutines()
		}
	}
	// Nothing limits the effects' stream here, so any gap the notifier
	// reports is false: messages a consumer leader delivered to a pull
	// request the notifier never read come again after their wait.
	if b, err := os.ReadFile(filepath.Join(p.logDir, "notifier.log")); err != nil {
		t.Error(err)
	} else if i := bytes.Index(b, []byte("were never delivered")); i >= 0 {
		t.Errorf("the notifier reported a gap in a stream that removes nothing unread: %s", b[max(0, i-200):min(len(b), i+100)])
	}
	st, err := p.readPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lost, n := checkWrites(l.acknowledged(), st); n > 0 {
		t.Errorf("%d acknowledged writes are not in Postgres at their version: %v", n, lost)
	}
	msgs, err := p.readStream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatalf("read %s: %v", contract.DocsStream, err)
	}
	lastSeq := p.lastSeq(ctx, contract.DocsStream)
	testenv.Eventually(t, "the tap to read the stream to its end", time.Minute, func() bool {
		_, last, _ := docsTap.seen()
		return last >= lastSeq
	})
	stopTap()
	tapDone()
	tapped, _, unread := docsTap.seen()
	t.Logf("the tap read %d messages over the run, %d sequences never read (removed before it read them)", len(tapped), unread)
	// The pause each kill caused: the longest time without a message
	// stored, and without a write acknowledged, in the minute after it
	// (the suite's own requests to the cluster wait out the election too,
	// so the pause is read off the timestamps afterwards).
	var storedAt, ackedAt []time.Time
	for _, m := range tapped {
		storedAt = append(storedAt, m.At)
	}
	for _, w := range l.acknowledged() {
		ackedAt = append(ackedAt, w.At)
	}
	for i, f := range faults {
		until := loadEnd
		if i+1 < len(faults) {
			until = faults[i+1].Start
		}
		t.Logf("fault %d (%s): longest gap in the stream %s, in acknowledged writes %s",
			f.N, f.Detail, short(longestGap(storedAt, f.Start, until)), short(longestGap(ackedAt, f.Start, until)))
	}
	sr := compareStream(msgs, tapped, st, faults, false)
	if sr.Phantoms > 0 || sr.MissingNewest > 0 {
		t.Errorf("the stream and the outbox disagree: %d stored events not in the outbox, %d keys without their newest event; e.g. %v",
			sr.Phantoms, sr.MissingNewest, sr.Examples)
		// Each such key's messages over the run, as the tap read them: which
		// copy came when.
		shown := 0
		for _, ex := range sr.Examples {
			key, _, _ := strings.Cut(ex, ":")
			if shown == 3 {
				break
			}
			shown++
			t.Logf("%s over the run: %s", key, tapHistory(tapped, st, key))
		}
	}
	// A leader change can lose a publish in flight while the relay's
	// connection stays up; the stream refuses the publishes after it (each
	// expects the one before it as the stream's last message), so none is
	// stored before the lost one, published again.
	if sr.Gaps > 0 || sr.GapsByDuplicate > 0 {
		t.Errorf("%d keys with a version stored out of commit order, %d with one pushed out of the history by an older copy stored again; e.g. %v",
			sr.Gaps, sr.GapsByDuplicate, sr.Examples)
	}
	er := compareEffects(p.recv.deliveries(), st, p.hookURL, faults)
	if er.Missing > 0 {
		t.Errorf("the receiver was never notified of %d of %d events; e.g. %v", er.Missing, er.Events, er.Examples)
	}
	if dead := p.deadLetters(ctx); dead > 0 {
		t.Errorf("%d dead letters", dead)
	}
	status, err := p.converge(ctx, p.operatorEnv(), "status", "-nats-url", p.natsURL, "-nats-user", natsauth.UserOperator)
	if err != nil {
		t.Errorf("converge status: %v\n%s", err, status)
	}
	for _, line := range strings.Split(status, "\n") {
		if strings.HasPrefix(line, contract.DocsStream) {
			if !strings.Contains(line, "3, leader n") {
				t.Errorf("converge status does not show the replicas and the leader: %q", line)
			}
			t.Logf("converge status: %s", strings.Join(strings.Fields(line), " "))
		}
	}
	t.Logf("load end -> converge verify exit 0: %s; -> every consumer drained: %s; stored duplicates %d (by cause %v); notified %d / %d",
		short(toVerify), short(toDrain), sr.Duplicates, sr.ByCause, er.Notified, er.Events)
}

// longestGap is the longest interval between consecutive times (sorted
// here) that ends after from and before until.
func longestGap(times []time.Time, from, until time.Time) time.Duration {
	ts := slices.Clone(times)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	var longest time.Duration
	for i := 1; i < len(ts); i++ {
		if ts[i].Before(from) || ts[i].After(until) {
			continue
		}
		longest = max(longest, ts[i].Sub(ts[i-1]))
	}
	return longest
}

// tapHistory is key's messages as the tap read them: sequence, version,
// and when the server stored it.
func tapHistory(tapped []stored, st *postgresState, key string) string {
	var b strings.Builder
	for _, m := range tapped {
		id, err := uuid.Parse(m.MsgID)
		if err != nil {
			continue
		}
		if e, ok := st.byID[id]; ok && e.Key == key {
			fmt.Fprintf(&b, "seq %d v%d at %s; ", m.Seq, e.Version, m.At.Format("15:04:05.000"))
		}
	}
	return b.String()
}
