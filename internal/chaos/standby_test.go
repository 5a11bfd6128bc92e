//go:build linux

package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// standbyTTL is the lease TTL of the standby test's instances.
const standbyTTL = 2 * time.Second

// pair is the two instances of one service sharing a store.
type pair struct {
	name     string // the lease's and the metrics' projector label
	stream   string // the consumer's stream
	consumer string
	a, b     *service
}

func (p pair) metric(s *service, name string) float64 {
	v, err := strconv.ParseFloat(s.metric(fmt.Sprintf(`%s{projector="%s"}`, name, p.name)), 64)
	if err != nil {
		return -1
	}
	return v
}

// applied is the events instance s wrote.
func (p pair) applied(s *service) float64 {
	v, err := strconv.ParseFloat(s.metric(fmt.Sprintf(`converge_projector_events_total{projector="%s",result="applied"}`, p.name)), 64)
	if err != nil {
		return -1
	}
	return v
}

func (s *service) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.child != nil
}

// writer is the instance that holds the lease (nil: none yet).
func (p pair) writer() *service {
	for _, s := range []*service{p.a, p.b} {
		if p.metric(s, "converge_projector_lease_terms_total") > 0 && p.metric(s, "converge_projector_standby") == 0 && s.running() {
			return s
		}
	}
	return nil
}

func (p pair) other(s *service) *service {
	if s == p.a {
		return p.b
	}
	return p.a
}

// takeover is what one fault of an active instance cost.
type takeover struct {
	service, fault   string
	toWriter, toDone time.Duration // to the other instance writing; to every event committed before the fault applied
	fenced, applied  float64       // the paused instance's, after it woke
}

// TestStandbyTakesOver runs the graph projector on Neo4j and the notifier
// twice each under load, and SIGKILLs, then SIGSTOPs, the instance that
// writes: the standby takes over in a bounded time and everything
// committed before the fault is applied soon after; the paused instance,
// once resumed, writes nothing and acknowledges nothing. Then both
// instances are killed and restarted (a plain restart): the time to
// convergence is measured too. At the end, converge verify agrees and the
// receiver saw every event once.
func TestStandbyTakesOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every service as a process of its own, with faults")
	}
	// A pipeline of its own and a Neo4j instance leased for it alone: it
	// runs beside TestNATSClusterLosesItsStreamLeader.
	t.Parallel()
	cfg := configFromFlags()
	cfg.standby, cfg.neo4j = true, testenv.LeaseNeo4j(t)
	cfg.rate, cfg.docs = 200, 200
	p := startPipeline(t, cfg)
	ctx := context.Background()
	l, stopLoad := p.startLoad(ctx, cfg)
	defer stopLoad()

	pairs := []pair{
		{name: "graph", stream: contract.DocsStream, consumer: "graph", a: p.service("projector-graph"), b: p.service("projector-graph-b")},
		{name: "notifier", stream: contract.EventsStream, consumer: "notifier", a: p.service("notifier"), b: p.service("notifier-b")},
	}
	var results []takeover
	for _, pr := range pairs {
		testenv.Eventually(t, pr.name+": one instance writing", time.Minute, func() bool { return pr.writer() != nil })
		for _, kind := range []string{"SIGKILL", "SIGSTOP"} {
			time.Sleep(2 * time.Second) // load flows to the writer
			w := pr.writer()
			if w == nil {
				t.Fatalf("%s: no instance writes", pr.name)
			}
			standby := pr.other(w)
			last := p.lastSeq(ctx, pr.stream)
			at := time.Now()
			var before float64
			if kind == "SIGKILL" {
				w.kill()
			} else {
				before = pr.applied(w)
				w.pause()
			}
			r := takeover{service: pr.name, fault: kind + " " + w.name}
			testenv.Eventually(t, standby.name+" to take over", 30*time.Second, func() bool {
				return pr.metric(standby, "converge_projector_standby") == 0 && pr.metric(standby, "converge_projector_lease_terms_total") > 0
			})
			r.toWriter = time.Since(at)
			testenv.Eventually(t, pr.name+": everything committed before the fault applied", 2*time.Minute, func() bool {
				return p.ackFloor(ctx, pr.stream, pr.consumer) >= last
			})
			r.toDone = time.Since(at)
			if kind == "SIGKILL" {
				w.start()
			} else {
				w.resume()
				// It wakes with the events it held and its lease gone.
				testenv.Eventually(t, w.name+" to stand by after waking", 30*time.Second, func() bool {
					return pr.metric(w, "converge_projector_standby") == 1
				})
				r.fenced = pr.metric(w, "converge_projector_fenced_events_total")
				r.applied = pr.applied(w) - before
			}
			testenv.Eventually(t, w.name+" to be ready again", time.Minute, w.ready)
			results = append(results, r)
			t.Logf("%-8s %-28s the other instance writing after %6s, everything before the fault applied after %6s  %s",
				pr.name, r.fault, short(r.toWriter), short(r.toDone), fencedNote(r, kind))
			if kind == "SIGSTOP" {
				// It may find its lease lost before it tries a write (it
				// then stops at once) or at the write (fenced, counted).
				// What it had already handed to the store when it was
				// paused may complete (the version guards make it
				// harmless); nothing after that.
				if r.applied > 300 {
					t.Errorf("%s wrote %v events after waking without its lease", w.name, r.applied)
				}
			}
		}
	}

	// A plain restart of both instances: nothing holds the lease but the
	// dead writer's key, which expires.
	for _, pr := range pairs {
		last := p.lastSeq(ctx, pr.stream)
		pr.a.kill()
		pr.b.kill()
		at := time.Now()
		pr.a.start()
		pr.b.start()
		testenv.Eventually(t, pr.name+" to converge after a restart", 2*time.Minute, func() bool {
			return p.ackFloor(ctx, pr.stream, pr.consumer) >= last
		})
		r := takeover{service: pr.name, fault: "SIGKILL both, restart", toDone: time.Since(at)}
		results = append(results, r)
		t.Logf("%-8s %-28s everything before the restart applied after %6s", pr.name, r.fault, short(r.toDone))
		for _, s := range []*service{pr.a, pr.b} {
			testenv.Eventually(t, s.name+" to be ready after the restart", time.Minute, s.ready)
		}
	}

	stopLoad()
	st := p.checkAfterLoad(ctx, l)
	er := compareEffects(p.recv.deliveries(), st, p.hookURL, nil)
	if er.Missing > 0 {
		t.Errorf("the receiver was never notified of %d of %d events; e.g. %v", er.Missing, er.Events, er.Examples)
	}
	if er.Phantoms > 0 || er.WrongKeys > 0 || er.ManyKeys > 0 || er.Invalid > 0 {
		t.Errorf("notifications: %d for no outbox event, %d with a wrong Idempotency-Key, %d events with more than one key, %d unsigned",
			er.Phantoms, er.WrongKeys, er.ManyKeys, er.Invalid)
	}
	if dead := p.deadLetters(ctx); dead > 0 {
		t.Errorf("%d dead letters", dead)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nTAKEOVERS (lease TTL %v, %.0f writes/s; this machine)\n", standbyTTL, cfg.rate)
	fmt.Fprintf(&b, "%-9s %-30s %-22s %s\n", "service", "fault", "other instance writing", "everything before the fault applied")
	for _, r := range results {
		w := "-"
		if r.toWriter > 0 {
			w = short(r.toWriter)
		}
		fmt.Fprintf(&b, "%-9s %-30s %-22s %s\n", r.service, r.fault, w, short(r.toDone))
	}
	fmt.Fprintf(&b, "notifications received / events: %d / %d, %d requests; effects answered 2xx twice: %d\n",
		er.Notified, er.Events, er.Requests, er.Twice)
	t.Log(b.String())
}

func fencedNote(r takeover, kind string) string {
	if kind != "SIGSTOP" {
		return ""
	}
	return fmt.Sprintf("; after waking it fenced %.0f events and wrote %.0f", r.fenced, r.applied)
}

// lastSeq is the stream's last sequence.
func (p *pipeline) lastSeq(ctx context.Context, stream string) uint64 {
	info, err := p.streamInfo(ctx, stream)
	if err != nil {
		p.t.Fatalf("stream %s: %v", stream, err)
	}
	return info.State.LastSeq
}

// ackFloor is the consumer's acknowledgement floor (0 when unreadable).
func (p *pipeline) ackFloor(ctx context.Context, stream, consumer string) uint64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := p.js.Consumer(ctx, stream, consumer)
	if err != nil {
		return 0
	}
	return c.CachedInfo().AckFloor.Stream
}

// checkAfterLoad checks, once the load has stopped, that converge verify
// agrees, that every consumer drained, and that every acknowledged write
// is in Postgres at its version; it returns what Postgres holds.
func (p *pipeline) checkAfterLoad(ctx context.Context, l *load) *postgresState {
	t := p.t
	t.Helper()
	loadEnd := time.Now()
	if _, out, err := p.verifyAgrees(ctx, loadEnd, 2*time.Minute); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	if _, err := p.drained(ctx, loadEnd, 2*time.Minute); err != nil {
		t.Error(err)
	}
	st, err := p.readPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lost, n := checkWrites(l.acknowledged(), st); n > 0 {
		t.Errorf("%d acknowledged writes are not in Postgres at their version: %v", n, lost)
	}
	return st
}
