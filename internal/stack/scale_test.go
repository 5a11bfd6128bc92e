// The scaling of partitioned projectors: N instances of one projector, each
// a process of the real binary, sharing its store (Qdrant, Neo4j) by
// partition, time the same pre-filled stream from its first event to its
// last applied. BenchmarkPartitionsScale (make bench) measures 1, 2 and 4
// instances of each projector; TestPartitionsScaleShort (make test) runs 1
// and 2 instances of the index projector on a few events and checks what
// each instance wrote, without timing anything against a bound.

package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/testenv/corpus"
	"github.com/converge-sync/converge/pkg/contract"
)

// scaleCredentialVars carry a credential: no instance inherits them from
// the test's environment, each gets what it needs alone.
var scaleCredentialVars = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE", "PGPASSWORD", "PGPASSFILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE", natsauth.EnvCreds, natsauth.EnvNKey,
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
	indexprojector.EnvQdrantAPIKey, graphprojector.EnvNeo4jPassword, config.EnvPartitions,
}

// scaleEvents are n documents of four 1 KB chunks, no two chunks of the
// same text (the index embeds each), with two links to other documents of
// the set and two tags of 64, so that the graph's transactions meet on
// some nodes as a real corpus's do.
func scaleEvents(n int) []contract.Event {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while projectors converge every store to postgres")
	return corpus.UpsertedEvents(corpus.Sequential(n, corpus.Shape{Keys: "scale-%d", Title: corpus.Fixed("scale"),
		Body: func(i int) string {
			var body strings.Builder
			for p := range 4 {
				fmt.Fprintf(&body, "Document %d, part %d:", i, p)
				for w := 0; body.Len() < (p+1)*1000; w++ {
					body.WriteString(" " + words[(i+p+w)%len(words)])
				}
				body.WriteString("\n\n")
			}
			return body.String()
		},
		Links: func(i int) []string {
			return []string{fmt.Sprintf("scale-%d", (i+1)%n), fmt.Sprintf("scale-%d", (i+7)%n)}
		},
		Tags: func(i int) []string { return []string{fmt.Sprintf("tag-%d", i%64), fmt.Sprintf("tag-%d", (i/64)%64)} },
	}))
}

// scaleProjector is a projector whose instances a scale run starts.
type scaleProjector struct {
	name   string // its durable name and leases' prefix: "index", "graph"
	binary string // "projector-index", "projector-graph"
	// args and env are every instance's settings beyond NATS, its
	// metrics address, its data directory and -partitions.
	args, env []string
	// stored counts the chunks its store holds once every event is in.
	stored func(ctx context.Context) (int, error)
	// server samples its store server's own figures, when it can (nil:
	// none).
	server func(ctx context.Context) (serverSample, error)
	// live names the store's live generation and gone reports whether a
	// generation no longer exists (nil: a store rebuilt in place).
	live func(ctx context.Context) (string, error)
	gone func(ctx context.Context, generation string) (bool, error)
}

// serverSample is a store server's counters at one moment.
type serverSample struct {
	at      time.Time
	cpu     time.Duration // the server process's CPU time (0: not known)
	commits int64         // the transactions its database has begun (-1: not known)
}

// scaleOptions are a scale run's instances and partitions.
type scaleOptions struct {
	instances, parts int
	// everyInstanceHolds starts the instances again, on other metrics
	// addresses (which name them in the leases), until each holds at
	// least one partition (a test that every instance writes); else the
	// split is whatever their first addresses give, as in a deployment.
	everyInstanceHolds bool
	// rebuild, once every event is applied, asks the last instance for a
	// rebuild of the store and checks it (rebuildScaled).
	rebuild bool
}

// scaleResult is one run: instances of a projector applying every event.
type scaleResult struct {
	instances, parts int
	events, chunks   int
	elapsed          time.Duration // from the first event in the partitioned stream to the last applied
	split            []int         // partitions each instance held
	applied          []int         // events each instance applied
	restarts         []string      // instances' exits while they were starting (each started again)
	retries          int           // batches the instances retried after a transient store error (a deadlock, say)
	fill             time.Duration // the server's copy of the stream into the partitioned one
	instanceCPU      time.Duration // the instances' processes' CPU time, together
	ownCPU           time.Duration // this process's (NATS, the embeddings endpoint, the polls)
	machineBusy      float64       // the machine's CPUs busy, on average (cores), whoever's processes
	serverCPU        float64       // the store server's CPU (cores), -1: not known
	serverTxPerSec   float64       // its database's transactions/s, -1: not known
}

func (r scaleResult) eventsPerSec() float64 { return float64(r.events) / r.elapsed.Seconds() }
func (r scaleResult) chunksPerSec() float64 { return float64(r.chunks) / r.elapsed.Seconds() }

// maxShare is the most partitions one instance held.
func (r scaleResult) maxShare() int { return slices.Max(r.split) }

// runScale starts a fresh NATS server holding the documents' stream with
// evs and the partitioned stream of opt.parts partitions over it, not yet
// fed; starts opt.instances instances of p and waits until they share the
// partitions (each partition's lease held, its consumer made, none
// changing hands); then lets the server feed the partitioned stream from
// the documents' stream, and times it until every partition's consumer
// has every event acknowledged (a projector acknowledges after its
// store's write). It checks that each event was applied once, by the
// instance holding its partition, and that the store holds every chunk.
func runScale(t testing.TB, bin *testenv.Binaries, p scaleProjector, evs []contract.Event, opt scaleOptions) scaleResult {
	t.Helper()
	instances, parts := opt.instances, opt.parts
	ctx := context.Background()
	res := scaleResult{instances: instances, parts: parts, events: len(evs), serverCPU: -1, serverTxPerSec: -1}
	perPart := make([]int, parts)
	for _, ev := range evs {
		res.chunks += len(ev.Chunks)
		perPart[contract.Partition(ev.Key, parts)]++
	}
	if opt.everyInstanceHolds && parts < instances {
		t.Fatalf("%d partitions cannot give each of %d instances one", parts, instances)
	}

	n := testenv.StartNATS(t)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	// The partitioned stream, as the operator makes it, then without its
	// source until the instances are in place: what they time is their
	// work, not their joining (which internal/projector's tests cover).
	if _, err := relay.ApplyPartsStream(ctx, js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatal(err)
	}
	partsStream, err := js.Stream(ctx, contract.PartsStream)
	if err != nil {
		t.Fatal(err)
	}
	unfed := partsStream.CachedInfo().Config
	unfed.Sources = nil
	if _, err := js.UpdateStream(ctx, unfed); err != nil {
		t.Fatalf("the partitioned stream without its source: %v", err)
	}
	publish(t, js, evs)

	var leases jetstream.KeyValue // once the first instance has made its bucket
	var ins []*scaleInstance
	var owner []int // by partition: the instance holding it
	for attempt := 1; ; attempt++ {
		ins = startInstances(t, bin, p, n.URL, opt)
		if owner, err = placement(ctx, js, &leases, p.name, ins, parts); err != nil {
			t.Fatalf("%d instances of %s sharing %d partitions: %v", instances, p.binary, parts, err)
		}
		res.split = make([]int, instances)
		for _, i := range owner {
			res.split[i]++
		}
		res.restarts = nil
		for _, in := range ins {
			for _, e := range in.exits {
				res.restarts = append(res.restarts, fmt.Sprintf("instance %d: %s", in.n, e))
			}
		}
		if !opt.everyInstanceHolds || slices.Min(res.split) > 0 {
			break
		}
		// Their names (their metrics addresses) gave one instance no
		// partition: others, then.
		t.Logf("split %v: an instance holds no partition; starting the instances again on other addresses", res.split)
		for _, in := range ins {
			in.stop(t)
		}
		if attempt == 10 {
			t.Fatalf("in 10 tries, no split of %d partitions among %d instances gave each one", parts, instances)
		}
	}

	var pids []int
	for _, in := range ins {
		pids = append(pids, in.child.Pid())
	}
	cpu0, own0, machine0 := processesCPU(pids), processCPU(os.Getpid()), readMachineCPU()
	var srv0 serverSample
	if p.server != nil {
		if srv0, err = p.server(ctx); err != nil {
			t.Logf("the store server's figures: %v", err)
		}
	}
	began := time.Now()
	if _, err := relay.ApplyPartsStream(ctx, js, relay.StreamConfig{}, parts, false); err != nil {
		t.Fatalf("the partitioned stream's source again: %v", err)
	}
	filled := false
	consumers := make([]jetstream.Consumer, parts)
	for part := range parts {
		if consumers[part], err = js.Consumer(ctx, contract.PartsStream, contract.PartitionName(p.name, part)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := began.Add(10 * time.Minute)
	for {
		if !filled {
			info, err := partsStream.Info(ctx)
			if err == nil && info.State.Msgs == uint64(len(evs)) {
				filled, res.fill = true, time.Since(began)
			}
		}
		if filled && caughtUp(ctx, consumers) {
			break
		}
		for _, in := range ins {
			if in.child.Exited() {
				t.Fatalf("%s %d exited: %v", p.binary, in.n, in.child.Err())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d instances of %s did not apply %d events within 10 minutes", instances, p.binary, len(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.elapsed = time.Since(began)
	res.instanceCPU = processesCPU(pids) - cpu0
	res.ownCPU = processCPU(os.Getpid()) - own0
	res.machineBusy = readMachineCPU().busySince(machine0)
	if p.server != nil && !srv0.at.IsZero() {
		if srv1, err := p.server(ctx); err == nil {
			d := srv1.at.Sub(srv0.at).Seconds()
			if srv0.cpu > 0 {
				res.serverCPU = (srv1.cpu - srv0.cpu).Seconds() / d
			}
			if srv0.commits >= 0 && srv1.commits >= 0 {
				res.serverTxPerSec = float64(srv1.commits-srv0.commits) / d
			}
		}
	}

	// Each event applied once, by the instance holding its partition;
	// the store holding every chunk.
	res.applied = make([]int, instances)
	for i, in := range ins {
		m, err := telemetry.Scrape(ctx, "http://"+in.addr+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for part := range parts {
			got := int(m.Sum("converge_projector_events_total", telemetry.Labels{"projector": contract.PartitionName(p.name, part), "result": "applied"}))
			want := 0
			if owner[part] == i {
				want = perPart[part]
			}
			if got != want {
				t.Errorf("%s %d applied %d events of partition %d, want %d (the partition's %d events, applied by its holder, instance %d, alone)",
					p.binary, i+1, got, part, want, perPart[part], owner[part]+1)
			}
			res.applied[i] += got
		}
		res.retries += int(m.Sum("converge_projector_retries_total", nil))
		if dl := m.Sum("converge_projector_dead_letters_total", nil); dl > 0 {
			t.Errorf("%s %d dead-lettered %.0f events", p.binary, i+1, dl)
		}
	}
	stored, err := p.stored(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stored != res.chunks {
		t.Errorf("%s: the store holds %d chunks, the stream's events %d", p.binary, stored, res.chunks)
	}
	if opt.rebuild {
		rebuildScaled(t, ins, p, res.chunks)
	}
	return res
}

// rebuildScaled asks the last of the instances for a rebuild of the store
// blue/green, waits until it is done, and checks that another generation
// is live, holding every chunk, and that the one before is gone.
func rebuildScaled(t testing.TB, ins []*scaleInstance, p scaleProjector, chunks int) {
	t.Helper()
	ctx := context.Background()
	before, err := p.live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	asked := ins[len(ins)-1]
	c := &rebuild.Client{Addr: asked.addr}
	var st rebuild.Status
	testenv.Eventually(t, "a rebuild to start", 30*time.Second, func() bool {
		var started bool
		st, started, err = c.Start(ctx)
		return err == nil && started
	})
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := c.Wait(wctx, st.ID, 50*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	after, err := p.live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Fatalf("rebuild %s done, but %s is still the live generation", st.ID, before)
	}
	if stored, err := p.stored(ctx); err != nil || stored != chunks {
		t.Errorf("%s after the rebuild: the store holds %d chunks (%v), the stream's events %d", p.binary, stored, err, chunks)
	}
	if gone, err := p.gone(ctx, before); err != nil || !gone {
		t.Errorf("%s after the rebuild: the previous generation %s is not dropped (%v)", p.binary, before, err)
	}
	for _, in := range ins {
		if in.child.Exited() {
			t.Errorf("%s %d exited during the rebuild: %v", p.binary, in.n, in.child.Err())
		}
	}
	t.Logf("rebuilt blue/green, asked of instance %d, in %v: %s -> %s", asked.n, took.Round(time.Millisecond), before, after)
}

// scaleInstance is one instance of a scale run: a process of a projector's
// binary.
type scaleInstance struct {
	n      int    // 1, 2, ...
	addr   string // its metrics address
	holder string // its name in the leases
	path   string
	args   []string
	env    []string
	log    string // its output's file
	child  *proc.Child
	// exits are its exits while the instances were starting, each
	// followed by a start again, as a supervisor restarts a process.
	exits []string
}

// start starts the process, its output appended to its log.
func (in *scaleInstance) start() error {
	out, err := os.OpenFile(in.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own
	in.child, err = proc.Start(in.path, in.args, proc.Options{Env: in.env, Unset: scaleCredentialVars, Out: out})
	return err
}

func (in *scaleInstance) stop(t testing.TB) {
	t.Helper()
	if err := in.child.Stop(30 * time.Second); err != nil && !in.child.Exited() {
		t.Errorf("stop instance %d: %v", in.n, err)
	}
}

// startInstances starts opt.instances instances of p on the NATS server
// at natsURL, each on a metrics address of its own, which names it in the
// leases; they are stopped when t ends, their logs shown if it failed.
func startInstances(t testing.TB, bin *testenv.Binaries, p scaleProjector, natsURL string, opt scaleOptions) []*scaleInstance {
	t.Helper()
	host, _ := os.Hostname()
	var ins []*scaleInstance
	for i := range opt.instances {
		addr, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		// The instance's name in the leases, as the projector makes it:
		// the host and its metrics address.
		in := &scaleInstance{n: i + 1, addr: addr, holder: host + "/" + addr, path: bin.Path(p.binary), env: p.env,
			args: append([]string{"-nats-url", natsURL, "-metrics-addr", addr, "-data-dir", t.TempDir(),
				"-partitions", strconv.Itoa(opt.parts), "-log-level", "warn"}, p.args...),
			log: filepath.Join(t.TempDir(), fmt.Sprintf("%s-%d.log", p.binary, i+1))}
		if err := in.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			in.stop(t)
			if b, err := os.ReadFile(in.log); t.Failed() && err == nil && len(b) > 0 {
				t.Logf("%s %d's log:\n%s", p.binary, in.n, lastLogLines(b, 30))
			}
		})
		ins = append(ins, in)
	}
	return ins
}

// placement waits until the instances share the partitions as they mean
// to: every instance ready, every partition's lease held by one of them
// and its consumer made, and no lease changing hands for placementCalm.
// It returns the instance (an index of ins) holding each partition.
func placement(ctx context.Context, js jetstream.JetStream, leases *jetstream.KeyValue, name string, ins []*scaleInstance, parts int) ([]int, error) {
	owner := make([]int, parts)
	var calmSince time.Time
	deadline := time.Now().Add(90 * time.Second)
	for ; ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the partitions not shared, with none changing hands for %v, within 90s", placementCalm)
		}
		settled := true
		for _, in := range ins {
			if in.child.Exited() {
				// An instance handing a partition over while its runtime
				// starts may exit; a supervisor would start it again.
				b, _ := os.ReadFile(in.log)
				in.exits = append(in.exits, fmt.Sprintf("%v: %s", in.child.Err(), lastLogLines(b, 1)))
				if len(in.exits) > 3 {
					return nil, fmt.Errorf("instance %d exited %d times while starting: %s", in.n, len(in.exits), strings.Join(in.exits, "; "))
				}
				if err := in.start(); err != nil {
					return nil, err
				}
				settled = false
				continue
			}
			settled = settled && stack.HTTPOK("http://"+in.addr+"/readyz")
		}
		if *leases == nil {
			kv, err := js.KeyValue(ctx, lease.Bucket)
			if err != nil {
				continue // not made yet
			}
			*leases = kv
		}
		now := make([]int, parts)
		for part := range parts {
			now[part] = -1
			e, err := (*leases).Get(ctx, projector.PartitionLease(name, part))
			if err != nil {
				settled = false
				continue
			}
			var v lease.Value
			if json.Unmarshal(e.Value(), &v) == nil {
				now[part] = slices.IndexFunc(ins, func(in *scaleInstance) bool { return in.holder == v.Holder })
			}
			if _, err := js.Consumer(ctx, contract.PartsStream, contract.PartitionName(name, part)); err != nil || now[part] < 0 {
				settled = false
			}
		}
		if !settled || !slices.Equal(now, owner) {
			owner, calmSince = now, time.Time{}
			continue
		}
		if calmSince.IsZero() {
			calmSince = time.Now()
		}
		if time.Since(calmSince) >= placementCalm {
			return owner, nil
		}
	}
}

// placementCalm is how long the partitions' holders must not change before
// a run begins: three times a lease's poll (lease.DefaultTTL/6), within
// which an instance takes a partition another hands it.
const placementCalm = 3 * lease.DefaultTTL / 6

// publish puts evs in the documents' stream as the relay does.
func publish(t testing.TB, js jetstream.JetStream, evs []contract.Event) {
	t.Helper()
	for _, ev := range evs {
		data, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(contract.Subject(ev.Key))
		m.Data = data
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("publishing the events took over a minute")
	}
}

// caughtUp reports whether every consumer has nothing pending and nothing
// unacknowledged.
func caughtUp(ctx context.Context, consumers []jetstream.Consumer) bool {
	for _, c := range consumers {
		info, err := c.Info(ctx)
		if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
			return false
		}
	}
	return true
}

func lastLogLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// clockTick is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go supports.
const clockTick = 100

// processCPU is the CPU time (user and system) of process pid so far, 0
// when it cannot be read.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command, in parentheses, may hold spaces: the fields are after
	// its closing one; utime and stime are the 14th and 15th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / clockTick
}

func processesCPU(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		d += processCPU(pid)
	}
	return d
}

// machineCPU is /proc/stat's first line: the machine's CPU time, busy and
// all, in ticks.
type machineCPU struct{ busy, total int64 }

func readMachineCPU() machineCPU {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return machineCPU{}
	}
	var m machineCPU
	for i, v := range strings.Fields(sc.Text())[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest times are within user's
			break
		}
		m.total += n
		if i != 3 && i != 4 { // idle, iowait
			m.busy += n
		}
	}
	return m
}

// busySince is the average number of the machine's CPUs busy since m0
// (-1: not known).
func (m machineCPU) busySince(m0 machineCPU) float64 {
	if m.total <= m0.total {
		return -1
	}
	return float64(m.busy-m0.busy) / float64(m.total-m0.total) * float64(runtime.NumCPU())
}
