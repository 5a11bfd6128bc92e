//go:build linux

package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// These tests run the relay as a separate process and SIGKILL it: no
// deferred code, no shutdown drain, no last status update, and whatever the
// NATS client had buffered is lost. Only Postgres's slot position and
// JetStream's stored messages survive, which is what recovery must rely on.
//
// The file is Linux-only because of Pdeathsig, which guarantees that no
// relay child outlives a test binary that dies without running cleanups
// (a -timeout panic).

// crashSeedEnv replays a run of TestRelaySurvivesRepeatedSIGKILL: set it to
// the seed the failed run logged.
const crashSeedEnv = "CONVERGE_CRASH_SEED"

// childSlot is the slot relay children use: the relay's default.
const childSlot = "converge_relay"

// relayChild is a relay running in a child process (see runChild).
type relayChild struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.LockedBuffer
	done chan struct{} // closed once the process is reaped
	err  error         // cmd.Wait's result; read only after done
}

// relayChildren keeps every child of a test, to show their logs on failure.
type relayChildren struct {
	mu   sync.Mutex
	list []*relayChild
	// effects runs the children with the effects' stream on.
	effects bool
}

func newRelayChildren(t *testing.T) *relayChildren {
	cs := &relayChildren{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		for _, c := range cs.list {
			t.Logf("--- %s output (tail) ---\n%s", c.name, lastBytes(c.out.String(), 3000))
		}
	})
	return cs
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// start runs a relay child against the fixture's database and the NATS
// server at natsURL. window 0 keeps the relay's default.
func (cs *relayChildren) start(t *testing.T, f *fixture, name, natsURL string, window int) *relayChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1",
		"CONVERGE_POSTGRES_URL="+f.dbURL,
		"CONVERGE_NATS_URL="+natsURL,
		"CONVERGE_RELAY_WINDOW="+strconv.Itoa(window),
		"CONVERGE_RELAY_EFFECTS="+strconv.FormatBool(cs.effects))
	out := &testenv.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// Should the test binary die without running its cleanups, the kernel
	// kills the child: a stray relay would hold the slot of the next run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start relay child: %v", err)
	}
	c := &relayChild{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	cs.mu.Lock()
	cs.list = append(cs.list, c)
	cs.mu.Unlock()
	t.Cleanup(c.stop)
	return c
}

// stop SIGKILLs the child, if still running, and reaps it. os.Process
// signals through a pidfd, so a reaped PID is never hit.
func (c *relayChild) stop() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func (c *relayChild) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// sigkill kills the child and checks that it was still running: a relay
// must never exit by itself.
func (c *relayChild) sigkill(t *testing.T) {
	t.Helper()
	if c.exited() {
		t.Errorf("%s exited by itself before the kill: %v\n%s", c.name, c.err, lastBytes(c.out.String(), 3000))
		return
	}
	c.stop()
	var ee *exec.ExitError
	if !errors.As(c.err, &ee) {
		t.Errorf("%s: wait after SIGKILL: %v", c.name, c.err)
		return
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("%s did not die of SIGKILL: %v\n%s", c.name, c.err, lastBytes(c.out.String(), 3000))
	}
}

// sessions counts the replication sessions the child started: each logs
// "relaying" once it holds the slot.
func (c *relayChild) sessions() int { return strings.Count(c.out.String(), "msg=relaying") }

// checkLog fails the test if the child logged an error or the race
// detector reported a race: nothing in these tests should end a session.
func (c *relayChild) checkLog(t *testing.T) {
	t.Helper()
	out := c.out.String()
	for _, bad := range []string{"level=ERROR", "DATA RACE", "panic:"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s logged %q:\n%s", c.name, bad, lastBytes(out, 3000))
		}
	}
}

// slotState reads the relay's slot in the fixture's database.
func slotState(t *testing.T, f *fixture) (exists, active bool, pid int32) {
	t.Helper()
	err := f.pool.QueryRow(context.Background(),
		// A slot being created is held (active) before it has a start
		// point; only a confirmed_flush_lsn shows it is ready and streaming.
		`SELECT active AND confirmed_flush_lsn IS NOT NULL, coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`,
		childSlot).Scan(&active, &pid)
	if err != nil {
		return false, false, 0
	}
	return true, active, pid
}

// requireNoSlot fails fast when another test left the slot behind: its
// name is cluster-wide, and a slot of another database would make every
// relay here fail.
func requireNoSlot(t *testing.T, f *fixture) {
	t.Helper()
	var db string
	err := f.pool.QueryRow(context.Background(), `SELECT database FROM pg_replication_slots WHERE slot_name = $1`, childSlot).Scan(&db)
	if err == nil {
		t.Fatalf("slot %s already exists (database %s): an earlier test did not drop it", childSlot, db)
	}
}

// releaseSlotOnCleanup waits, after the children are killed, for their
// walsenders to exit: the fixture drops only an inactive slot, and a slot
// left behind blocks DROP DATABASE and every later test. Call it before
// starting any child so that it runs after their cleanups.
func releaseSlotOnCleanup(t *testing.T, f *fixture) {
	t.Cleanup(func() {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if _, active, _ := slotState(t, f); !active {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("slot %s still active 15s after every relay was killed", childSlot)
	})
}

// docWriter commits document versions with docstore.Apply until stopped. It
// is the only writer, so each key's versions commit in increasing order:
// the order its subject must show in the stream.
type docWriter struct {
	store    *docstore.Store
	rng      *rand.Rand
	keys     int
	versions map[string]int64

	stopc chan struct{}
	done  chan struct{}
	// Read after done.
	txs, events int
}

func startWriter(t *testing.T, store *docstore.Store, rng *rand.Rand, keys int) *docWriter {
	w := &docWriter{store: store, rng: rng, keys: keys, versions: map[string]int64{},
		stopc: make(chan struct{}), done: make(chan struct{})}
	go w.run(t)
	t.Cleanup(w.stop)
	return w
}

func (w *docWriter) stop() {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
}

func (w *docWriter) run(t *testing.T) {
	defer close(w.done)
	for {
		select {
		case <-w.stopc:
			return
		default:
		}
		// A quarter single-document transactions, the rest 1..50 documents;
		// keys repeat within a batch too (one round per occurrence).
		n := 1
		if w.rng.IntN(4) != 0 {
			n = 1 + w.rng.IntN(50)
		}
		writes := make([]docstore.Write, n)
		for i := range writes {
			key := fmt.Sprintf("doc-%03d", w.rng.IntN(w.keys))
			w.versions[key]++
			v := w.versions[key]
			if w.rng.IntN(20) == 0 {
				writes[i] = docstore.Write{Doc: contract.Document{Key: key, Version: v}, Withdraw: true}
			} else {
				writes[i] = docstore.Write{Doc: contract.Document{Key: key, Version: v, Title: "t",
					Body: fmt.Sprintf("%s at version %d", key, v)}}
			}
		}
		outs, err := w.store.Apply(context.Background(), writes)
		if err != nil {
			t.Errorf("writer: apply: %v", err)
			return
		}
		for _, o := range outs {
			if o.Err != nil || o.Result != docstore.Applied {
				t.Errorf("writer: %s v%d: %s %v", o.Key, o.Version, o.Result, o.Err)
				return
			}
		}
		w.txs++
		w.events += n
		// About 30 transactions a second: enough to have transactions in
		// flight at every kill, while leaving CPU to the relays, Postgres
		// and NATS on a small machine.
		time.Sleep(time.Duration(w.rng.IntN(60)) * time.Millisecond)
	}
}

// publishCounter sees every publish on the docs subjects, duplicates
// included (JetStream drops those only in the stream), so it counts how
// many events the crashes made relays publish again.
type publishCounter struct {
	mu  sync.Mutex
	ids map[string]int
}

func countPublishes(t *testing.T, f *fixture) *publishCounter {
	t.Helper()
	pc := &publishCounter{ids: map[string]int{}}
	nc := f.nats.Connect(t)
	sub, err := nc.Subscribe(contract.DocsSubjectPrefix+">", func(m *nats.Msg) {
		pc.mu.Lock()
		pc.ids[m.Header.Get(jetstream.MsgIDHeader)]++
		pc.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return pc
}

// republished returns the messages seen and those beyond each event's first.
func (pc *publishCounter) republished() (msgs, again int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, n := range pc.ids {
		msgs += n
		again += n - 1
	}
	return msgs, again
}

// waitCaughtUp waits until the slot has confirmed past every commit made so
// far and the stream holds at least as many messages as the outbox has
// rows. It reports a timeout without failing: checkStream then says what
// is missing.
func waitCaughtUp(t *testing.T, f *fixture, timeout time.Duration) bool {
	t.Helper()
	ctx := context.Background()
	var end string
	if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	var rows uint64
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var confirmed bool
		_ = f.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2 AND database = current_database()`,
			end, childSlot).Scan(&confirmed)
		if confirmed && streamMsgs(t, f.js) >= rows {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("not caught up after %v: slot confirmed past %s: %v; stream %d messages, outbox %d rows",
				timeout, end, confirmed, streamMsgs(t, f.js), rows)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type outboxEvent struct {
	key     string
	version int64
}

type streamStats struct {
	outbox, msgs, storedDuplicates int
}

// checkStream compares the documents' stream with the outbox: every
// committed event stored, exactly once, on its document's subject, nothing
// else stored, and each subject's versions in commit order.
func checkStream(t *testing.T, f *fixture) streamStats {
	t.Helper()
	return checkStreamOf(t, f, contract.DocsStream, contract.Subject)
}

// checkStreamOf is checkStream of stream, whose subject of a key is
// subject(key).
func checkStreamOf(t *testing.T, f *fixture, stream string, subject func(string) string) streamStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Nothing deletes outbox rows in tests: it holds every committed event.
	rows, err := f.pool.Query(ctx, `SELECT event_id::text, key, version FROM outbox ORDER BY key, version`)
	if err != nil {
		t.Fatal(err)
	}
	outbox := map[string]outboxEvent{}
	for rows.Next() {
		var (
			id string
			ev outboxEvent
		)
		if err := rows.Scan(&id, &ev.key, &ev.version); err != nil {
			t.Fatal(err)
		}
		outbox[id] = ev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	s, err := f.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxMsgsPerSubject != -1 {
		t.Fatalf("stream keeps %d messages per subject; the checks need every message (-1)", info.Config.MaxMsgsPerSubject)
	}
	// Every message in order: an ordered consumer, or (a work queue admits
	// no consumer that does not acknowledge) a get by sequence.
	var next func() (subject string, header nats.Header, data []byte, seq uint64, err error)
	if info.Config.Retention == jetstream.WorkQueuePolicy {
		seq := info.State.FirstSeq
		next = func() (string, nats.Header, []byte, uint64, error) {
			m, err := s.GetMsg(ctx, seq)
			seq++
			if err != nil {
				return "", nil, nil, 0, err
			}
			return m.Subject, m.Header, m.Data, m.Sequence, nil
		}
	} else {
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			t.Fatal(err)
		}
		defer it.Stop()
		next = func() (string, nats.Header, []byte, uint64, error) {
			m, err := it.Next(jetstream.NextMaxWait(10 * time.Second))
			if err != nil {
				return "", nil, nil, 0, err
			}
			md, err := m.Metadata()
			if err != nil {
				return "", nil, nil, 0, err
			}
			return m.Subject(), m.Headers(), m.Data(), md.Sequence.Stream, nil
		}
	}

	var (
		stored                   = map[string]int{}
		lastVersion              = map[string]int64{}
		extra, disorder, badMsgs []string
		dups                     int
	)
	for read := uint64(0); read < info.State.Msgs; read++ {
		subj, header, data, seq, err := next()
		if err != nil {
			t.Fatalf("read %s message %d of %d: %v", stream, read+1, info.State.Msgs, err)
		}
		id := header.Get(jetstream.MsgIDHeader)
		stored[id]++
		if stored[id] > 1 {
			dups++
		}
		// The payload names its event too: a Nats-Msg-Id that differs
		// would defeat deduplication.
		dec, err := contract.DecodeEvent(data)
		if err != nil || dec.ID.String() != id {
			badMsgs = append(badMsgs, fmt.Sprintf("seq %d: Nats-Msg-Id %q, payload event %s (%v)", seq, id, dec.ID, err))
		}
		ev, ok := outbox[id]
		if !ok {
			extra = append(extra, fmt.Sprintf("seq %d: Nats-Msg-Id %q on subject %s", seq, id, subj))
			continue
		}
		if subj != subject(ev.key) || dec.Key != ev.key || dec.Version != ev.version {
			badMsgs = append(badMsgs, fmt.Sprintf("seq %d: outbox event %s (%s v%d) on subject %s with payload %s v%d",
				seq, id, ev.key, ev.version, subj, dec.Key, dec.Version))
		}
		if last, seen := lastVersion[subj]; seen && ev.version <= last {
			disorder = append(disorder, fmt.Sprintf("seq %d: %s v%d after v%d", seq, ev.key, ev.version, last))
		}
		lastVersion[subj] = max(lastVersion[subj], ev.version)
	}

	var missing []string
	for id, ev := range outbox {
		if stored[id] == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s v%d)", id, ev.key, ev.version))
		}
	}
	report := func(what string, list []string) {
		if len(list) > 0 {
			t.Errorf("%d %s, e.g.:\n  %s", len(list), what, strings.Join(list[:min(len(list), 10)], "\n  "))
		}
	}
	report("committed events missing from "+stream, missing)
	report(stream+" messages that are no outbox event", extra)
	report(stream+" messages out of commit order on their subject", disorder)
	report(stream+" messages with a wrong subject or payload", badMsgs)
	if dups != 0 {
		t.Errorf("%d duplicates stored (same Nats-Msg-Id more than once in %s)", dups, stream)
	}
	return streamStats{outbox: len(outbox), msgs: int(info.State.Msgs), storedDuplicates: dups}
}

// stopGracefully ends the child with SIGTERM, as an operator would, and
// checks that it exits cleanly.
func (c *relayChild) stopGracefully(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("%s: SIGTERM: %v", c.name, err)
	}
	select {
	case <-c.done:
		if c.err != nil {
			t.Errorf("%s: exit after SIGTERM: %v\n%s", c.name, c.err, lastBytes(c.out.String(), 3000))
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s still running 30s after SIGTERM", c.name)
	}
}

func waitActive(t *testing.T, f *fixture, c *relayChild, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, c.name+" to hold the slot", timeout, func() bool {
		if c.exited() {
			t.Fatalf("%s exited: %v\n%s", c.name, c.err, lastBytes(c.out.String(), 3000))
		}
		_, active, _ := slotState(t, f)
		return active && c.sessions() > 0
	})
}

func TestRelaySurvivesRepeatedSIGKILL(t *testing.T) {
	// Its own NATS server and database; of the tests on the shared
	// cluster that run beside it, none takes the default slot it uses
	// (TestStandbyTakesOver, which does, runs alone).
	t.Parallel()
	const kills = 21 // a third of each kind below
	seed := rand.Uint64()
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s: %v", crashSeedEnv, err)
		}
	}
	t.Logf("seed %d (set %s=%d to replay the kill schedule)", seed, crashSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	begin := time.Now()

	f := newFixture(t)
	requireNoSlot(t, f)
	releaseSlotOnCleanup(t, f)
	cs := newRelayChildren(t)
	// Both streams, as where a notifier runs: each transaction is
	// confirmed only once both stored it.
	cs.effects = true
	pc := countPublishes(t, f)

	link := startLossyLink(t, f.nats.URL)
	// The slot starts at its creation: the writer may start only once it
	// exists, or its first events would never be relayed.
	c := cs.start(t, f, "relay-0", link.URL(), 0)
	waitActive(t, f, c, 30*time.Second)
	w := startWriter(t, f.store, rand.New(rand.NewPCG(seed, 2)), 200)
	killsStart := time.Now()

	windows := []int{2, 4, 64, 0} // 2: one event (its two publishes) at a time
	activeKills, frozenKills := 0, 0
	for i := range kills {
		if i > 0 {
			c = cs.start(t, f, fmt.Sprintf("relay-%d", i), link.URL(), windows[rng.IntN(len(windows))])
		}
		frozen := false
		switch i % 3 {
		case 0:
			// Anywhere: during start-up, while a standby for the previous
			// walsender to go, or while relaying.
			time.Sleep(time.Duration(rng.IntN(700)) * time.Millisecond)
		case 1:
			// Surely mid-stream: publishes in flight, acknowledged ones
			// not yet confirmed to Postgres.
			waitActive(t, f, c, 30*time.Second)
			time.Sleep(time.Duration(rng.IntN(700)) * time.Millisecond)
		case 2:
			// Mid-stream with publishes stuck on the way for longer than
			// the 1 s status interval, so Postgres hears of positions past
			// them, then lost with the process: a relay that confirmed
			// before the acknowledgement would lose them for good.
			waitActive(t, f, c, 30*time.Second)
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			link.freeze()
			frozen = true
			time.Sleep(time.Duration(1050+rng.IntN(400)) * time.Millisecond)
		}
		if c.sessions() > 0 {
			activeKills++
			if frozen {
				frozenKills++
			}
		}
		c.sigkill(t)
		if frozen {
			link.thawAfterClientsGone(t)
		}
		c.checkLog(t)
		if t.Failed() {
			t.FailNow()
		}
	}
	w.stop()
	if t.Failed() {
		t.FailNow()
	}
	killPhase := time.Since(killsStart)

	catchUpStart := time.Now()
	final := cs.start(t, f, "relay-final", link.URL(), 0)
	caughtUp := waitCaughtUp(t, f, 30*time.Second)
	final.stopGracefully(t)
	final.checkLog(t)
	catchUp := time.Since(catchUpStart)
	checkStart := time.Now()
	st := checkStream(t, f)
	ev := checkStreamOf(t, f, contract.EventsStream, contract.EventsSubject)
	check := time.Since(checkStart)
	published, again := pc.republished()

	t.Logf("kills %d (%d while relaying, %d of them with publishes stuck in transit); writer %d transactions, %d events; outbox %d rows; stream %d messages, effects' stream %d; "+
		"duplicates stored %d and %d; publishes seen %d, of which %d republished and dropped as duplicates; caught up %v; "+
		"kill phase %v, catch-up %v, check %v, total %v",
		kills, activeKills, frozenKills, w.txs, w.events, st.outbox, st.msgs, ev.msgs, st.storedDuplicates, ev.storedDuplicates, published, again, caughtUp,
		killPhase.Round(time.Millisecond), catchUp.Round(time.Millisecond), check.Round(time.Millisecond),
		time.Since(begin).Round(time.Millisecond))
	if st.outbox != w.events {
		t.Errorf("outbox holds %d rows, the writer committed %d events", st.outbox, w.events)
	}
	if activeKills < 2*kills/3 {
		t.Errorf("only %d of %d kills hit a relaying process", activeKills, kills)
	}
	// Kills within a status interval of a session's start leave its
	// acknowledged events unconfirmed: without republishing, the test
	// would not have exercised the duplicate window at all.
	if again == 0 {
		t.Errorf("no event was published twice: the kills never forced a replay")
	}
}

func TestStandbyTakesOver(t *testing.T) {
	begin := time.Now()
	f := newFixture(t)
	requireNoSlot(t, f)
	releaseSlotOnCleanup(t, f)
	cs := newRelayChildren(t)
	pc := countPublishes(t, f)

	a := cs.start(t, f, "relay-a", f.nats.URL, 0)
	waitActive(t, f, a, 30*time.Second)
	_, _, pidA := slotState(t, f)
	w := startWriter(t, f.store, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3)), 100)

	b := cs.start(t, f, "relay-b", f.nats.URL, 0)
	testenv.Eventually(t, "relay-b to wait as a standby", 30*time.Second, func() bool {
		return strings.Contains(b.out.String(), "waiting as a standby") || b.exited()
	})
	// While A lives, B keeps retrying without taking the slot or failing,
	// and events keep flowing through A.
	before := streamMsgs(t, f.js)
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		_, active, pid := slotState(t, f)
		if !active || pid != pidA {
			t.Fatalf("with relay-a alive, slot active=%v pid %d, want active under walsender %d", active, pid, pidA)
		}
		if a.exited() || b.exited() {
			t.Fatalf("a relay exited: relay-a %v, relay-b %v", a.exited(), b.exited())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := b.sessions(); n != 0 {
		t.Fatalf("relay-b started %d sessions while relay-a held the slot", n)
	}
	b.checkLog(t)
	if after := streamMsgs(t, f.js); after <= before {
		t.Fatalf("no events relayed while relay-b waited: stream at %d, then %d", before, after)
	}

	killed := time.Now()
	a.sigkill(t)
	testenv.Eventually(t, "relay-b to take over the slot", 10*time.Second, func() bool {
		_, active, pid := slotState(t, f)
		return active && pid != 0 && pid != pidA && b.sessions() > 0
	})
	takeover := time.Since(killed)
	if takeover > 5*time.Second {
		t.Errorf("relay-b took %v to take over", takeover)
	}
	// Writes after the takeover flow through relay-b.
	atTakeover := streamMsgs(t, f.js)
	testenv.Eventually(t, "events relayed by relay-b after the takeover", 10*time.Second, func() bool {
		return streamMsgs(t, f.js) > atTakeover
	})
	w.stop()
	if t.Failed() {
		t.FailNow()
	}
	caughtUp := waitCaughtUp(t, f, 30*time.Second)
	if n := streamMsgs(t, f.js); n <= atTakeover {
		t.Errorf("no events relayed after the takeover: stream at %d, then %d", atTakeover, n)
	}
	b.stopGracefully(t)
	b.checkLog(t)
	a.checkLog(t)
	st := checkStream(t, f)
	published, again := pc.republished()
	t.Logf("takeover %v after SIGKILL; writer %d transactions, %d events; outbox %d rows; stream %d messages; "+
		"duplicates stored %d; publishes seen %d, of which %d republished; caught up %v; %v",
		takeover.Round(time.Millisecond), w.txs, w.events, st.outbox, st.msgs, st.storedDuplicates, published, again,
		caughtUp, time.Since(begin).Round(time.Millisecond))
	if st.outbox != w.events {
		t.Errorf("outbox holds %d rows, the writer committed %d events", st.outbox, w.events)
	}
}

// lossyLink is a TCP relay between relay children and NATS. Over loopback
// a killed process's publishes have all reached the server, so a relay that
// confirmed to Postgres before JetStream's acknowledgement would still pass.
// Frozen, the link holds what clients send, as a stalled network would;
// what a client sent before it died is then dropped, as a crashed host's
// unsent data is. Server-to-client traffic is never held.
type lossyLink struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	frozen  bool
	closed  bool
	readers int // client connections whose end has not been seen yet
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startLossyLink(t *testing.T, natsURL string) *lossyLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &lossyLink{ln: ln, target: strings.TrimPrefix(natsURL, "nats://"), conns: map[net.Conn]struct{}{}}
	l.cond = sync.NewCond(&l.mu)
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(l.close)
	return l
}

func (l *lossyLink) URL() string { return "nats://" + l.ln.Addr().String() }

func (l *lossyLink) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", l.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		l.conns[c], l.conns[s] = struct{}{}, struct{}{}
		l.readers++
		l.mu.Unlock()
		l.wg.Add(3)
		go l.serve(c, s)
	}
}

// serve pumps one client connection: a reader queues what the client
// sends, a writer delivers it while the link is not frozen, and server
// traffic is copied back as is.
func (l *lossyLink) serve(c, s net.Conn) {
	var (
		queue [][]byte // guarded by l.mu
		ended bool     // the client's end was seen
	)
	go func() {
		defer l.wg.Done()
		_, _ = io.Copy(c, s)
		_ = c.Close()
	}()
	go func() {
		defer l.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			l.mu.Lock()
			if n > 0 {
				queue = append(queue, bytes.Clone(buf[:n]))
			}
			if err != nil {
				ended = true
				l.readers--
				if l.frozen {
					queue = nil // in transit when the client died: lost
				}
			}
			l.cond.Broadcast()
			l.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	defer l.wg.Done()
	l.mu.Lock()
	for !l.closed {
		if len(queue) == 0 || l.frozen {
			if ended && len(queue) == 0 {
				break
			}
			l.cond.Wait()
			continue
		}
		chunk := queue[0]
		queue = queue[1:]
		l.mu.Unlock()
		_, err := s.Write(chunk)
		l.mu.Lock()
		if err != nil {
			break
		}
	}
	delete(l.conns, c)
	delete(l.conns, s)
	l.mu.Unlock()
	_ = s.Close()
	_ = c.Close()
}

func (l *lossyLink) freeze() {
	l.mu.Lock()
	l.frozen = true
	l.mu.Unlock()
}

// thawAfterClientsGone resumes delivery once the link has seen the end of
// every client connection, so that nothing a killed relay sent while frozen
// is delivered late.
func (l *lossyLink) thawAfterClientsGone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.readers > 0 {
		if time.Now().After(deadline) {
			t.Errorf("link: %d client connections still open 10s after the kill", l.readers)
			break
		}
		l.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		l.mu.Lock()
	}
	l.frozen = false
	l.cond.Broadcast()
}

func (l *lossyLink) close() {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
}
