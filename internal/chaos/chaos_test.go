//go:build linux

package chaos

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/binary"
	"flag"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

var (
	// The short form (make test) injects each kind of fault once, in a
	// seeded order: more faults would only repeat kinds already injected,
	// which the long form (make chaos, 300 faults) does at length.
	flagFaults    = flag.Int("chaos.faults", len(choices), "faults to inject (0: none, the load alone; default: each kind once)")
	flagSeed      = flag.Uint64("chaos.seed", 0, "seed of the faults and the load (0: a random one, printed)")
	flagDuration  = flag.Duration("chaos.duration", 0, "the load runs at least this long, and until every fault is injected (0 with no faults: 60s)")
	flagInterval  = flag.Duration("chaos.interval", time.Second, "mean time between the recovery from a fault and the next fault")
	flagDocs      = flag.Int("chaos.docs", 400, "documents the producers write")
	flagProducers = flag.Int("chaos.producers", 8, "producers writing at once")
	flagRate      = flag.Float64("chaos.rate", 400, "writes per second of all producers together (0: as fast as they can)")
	flagHistory   = flag.Int("chaos.history", 0, "the relay's -stream-history (0: its default; -1: keep every event, checked one by one)")
	flagRecovery  = flag.Duration("chaos.recovery", 2*time.Minute, "how long the pipeline may take to recover from one fault")
	flagSettle    = flag.Duration("chaos.settle", 5*time.Minute, "how long the stores may take to agree once the load ends")
	flagFailures  = flag.Float64("chaos.receiver-failures", 0.01, "fraction of webhook requests the receiver answers 503")
	flagDelay     = flag.Duration("chaos.receiver-delay", 0, "how long the receiver takes to answer each request (a slow receiver makes the notifier lag)")
	flagKinds     = flag.String("chaos.kinds", "", "the faults to choose from, comma-separated (default all): "+strings.Join(choices, ", "))
	flagLogs      = flag.String("chaos.logs", "", "keep every process's log in this directory (default: a temporary one)")
	flagIndex     = flag.String("chaos.index", "auto", "the index projector's store: embedded, qdrant (a collection of the test Qdrant server, with its API key), or auto: qdrant when the test run has a Qdrant server (as make test does), else embedded")
)

// runConfig is one run's settings, from the flags.
type runConfig struct {
	faults           int
	seed             uint64
	duration         time.Duration
	interval         time.Duration
	docs, producers  int
	rate             float64
	history          int
	recovery, settle time.Duration
	receiverFailures float64
	receiverDelay    time.Duration
	kinds            []string // the choices to pick from
	notRun           []string // kinds asked for that this machine cannot inject, and why
	logDir           string
	// standby runs the graph projector on neo4j and the notifier twice
	// each (projector-graph-b, notifier-b), one writing, one standing by.
	standby bool
	neo4j   testenv.Neo4j
	// partitions, with neo4j, runs the graph projector in this many
	// partitions on three instances (projector-graph, -b and -c).
	partitions int
	// cluster runs NATS as a cluster of three, every stream and bucket
	// with three replicas.
	cluster bool
	// qdrant holds the index projector's store, a collection with an API
	// key; nil: the embedded index.
	qdrant *testenv.Qdrant
}

func configFromFlags() runConfig {
	c := runConfig{faults: *flagFaults, seed: *flagSeed, duration: *flagDuration, interval: *flagInterval,
		docs: *flagDocs, producers: *flagProducers, rate: *flagRate, history: *flagHistory,
		recovery: *flagRecovery, settle: *flagSettle, receiverFailures: *flagFailures, receiverDelay: *flagDelay, logDir: *flagLogs}
	if c.seed == 0 {
		var b [8]byte
		_, _ = cryptorand.Read(b[:])
		c.seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	c.kinds = choices
	if *flagKinds != "" {
		c.kinds = strings.Split(*flagKinds, ",")
	}
	if c.faults == 0 && c.duration == 0 {
		c.duration = 60 * time.Second
	}
	return c
}

// TestChaos runs the pipeline as separate processes under a load of
// producers while it injects -chaos.faults faults chosen by a seeded
// random source, then checks that nothing acknowledged was lost and that
// every store, the stream and the webhook receiver agree with Postgres.
// `make chaos` runs 200 faults; `make test` the short form.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every service as a process of its own, with faults")
	}
	cfg := configFromFlags()
	for _, k := range cfg.kinds {
		if !slices.Contains(choices, k) {
			t.Fatalf("-chaos.kinds: no fault %q among %q", k, choices)
		}
	}
	switch *flagIndex {
	case "qdrant":
		q := testenv.LeaseQdrantKeyed(t)
		cfg.qdrant = &q
	case "auto":
		if os.Getenv(testenv.EnvTestQdrantKeyedURL) != "" {
			q := testenv.LeaseQdrantKeyed(t)
			cfg.qdrant = &q
		}
	case "embedded":
	default:
		t.Fatalf("-chaos.index: %q is none of embedded, qdrant, auto", *flagIndex)
	}
	t.Logf("chaos: seed %d (replay the faults with -chaos.seed=%d), %d faults, %d producers, %d documents, %.0f writes/s, the index %s",
		cfg.seed, cfg.seed, cfg.faults, cfg.producers, cfg.docs, cfg.rate, cfg.indexStore())
	p := startPipeline(t, cfg)
	if p.disk == nil && slices.Contains(cfg.kinds, "fill disk") {
		cfg.kinds = slices.DeleteFunc(slices.Clone(cfg.kinds), func(k string) bool { return k == "fill disk" })
		cfg.notRun = append(cfg.notRun, "fill disk (no file system of its own for the NATS store here)")
	}
	t.Logf("links a fault can cut or freeze: %v", p.links.list())
	ctx := context.Background()

	l, stopLoad := p.startLoad(ctx, cfg)
	defer stopLoad()
	tapCtx, stopTap := context.WithCancel(ctx)
	defer stopTap()
	docsTap, tapDone := p.startTap(tapCtx, contract.DocsStream)
	backlog, stopSampling := p.sampleBacklogs(ctx, 2*time.Second)
	defer stopSampling()
	start := time.Now()

	rng := rand.New(rand.NewPCG(cfg.seed, 0xfa17))
	// Every kind once first, in a seeded order, when the run has room for
	// it: even the short form injects each.
	var first []string
	if cfg.faults >= len(cfg.kinds) {
		for _, i := range rng.Perm(len(cfg.kinds)) {
			first = append(first, cfg.kinds[i])
		}
	}
	var faults []*fault
	for n := 1; n <= cfg.faults; n++ {
		time.Sleep(time.Duration(float64(cfg.interval) * (0.5 + rng.Float64())))
		choice := cfg.kinds[rng.IntN(len(cfg.kinds))]
		if n <= len(first) {
			choice = first[n-1]
		}
		f := p.inject(ctx, rng, choice, n)
		p.recovered(ctx, f, l, cfg.recovery)
		faults = append(faults, f)
		t.Logf("fault %3d %-26s %-40s ready %6s  writes %6s  stream %6s  %s", n, f.Kind, f.Detail,
			short(f.Ready), short(f.Writes), short(f.Stream), f.Failed)
		if f.Failed != "" {
			t.Errorf("fault %d (%s, %s): %s", n, f.Kind, f.Detail, f.Failed)
			break
		}
	}
	if rest := cfg.duration - time.Since(start); rest > 0 && !t.Failed() {
		time.Sleep(rest)
	}
	stopLoad()
	loadEnd := time.Now()
	backlog.sample(ctx, p)
	stopSampling()
	loadTime := loadEnd.Sub(start)

	// Every process up, then agreement.
	for _, s := range p.services {
		testenv.Eventually(t, s.name+" to be ready after the load", 2*time.Minute, s.ready)
	}
	toVerify, verifyOut, verifyErr := p.verifyAgrees(ctx, loadEnd, cfg.settle)
	if verifyErr != nil {
		t.Errorf("%v\n%s", verifyErr, verifyOut)
	}
	toDrain, drainErr := p.drained(ctx, loadEnd, cfg.settle)
	if drainErr != nil {
		t.Error(drainErr)
	}

	st, err := p.readPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writes := l.acknowledged()
	lost, nLost := checkWrites(writes, st)
	if nLost > 0 {
		t.Errorf("%d acknowledged writes are not in Postgres at their version: %v", nLost, lost)
	}
	msgs, err := p.readStream(ctx, contract.DocsStream)
	if err != nil {
		t.Errorf("read %s: %v", contract.DocsStream, err)
	}
	lastSeq := uint64(0)
	if info, err := p.streamInfo(ctx, contract.DocsStream); err == nil {
		lastSeq = info.State.LastSeq
	}
	testenv.Eventually(t, "the tap to read the stream to its end", time.Minute, func() bool {
		_, last, _ := docsTap.seen()
		return last >= lastSeq
	})
	stopTap()
	tapDone()
	tapped, _, unread := docsTap.seen()
	sr := compareStream(msgs, tapped, st, faults, cfg.history == -1)
	sr.EverStored, sr.Unread = lastSeq, unread
	if sr.Phantoms > 0 || sr.MissingNewest > 0 || sr.Gaps > 0 || sr.MissingAll > 0 {
		t.Errorf("the stream and the outbox disagree: %d stored events not in the outbox, %d keys without their newest event, %d keys with a version skipped, %d outbox events not stored; e.g. %v",
			sr.Phantoms, sr.MissingNewest, sr.Gaps, sr.MissingAll, sr.Examples)
	}
	er := compareEffects(p.recv.deliveries(), st, p.hookURL, faults)
	if er.Missing > 0 {
		t.Errorf("the receiver was never notified of %d of %d events; e.g. %v", er.Missing, er.Events, er.Examples)
	}
	if er.Phantoms > 0 || er.WrongKeys > 0 || er.ManyKeys > 0 || er.Invalid > 0 {
		t.Errorf("notifications: %d for no outbox event, %d with a wrong Idempotency-Key, %d events with more than one key, %d not signed with the run's secret",
			er.Phantoms, er.WrongKeys, er.ManyKeys, er.Invalid)
	}
	if n := er.TwiceByCause["unexplained"]; n > 0 {
		t.Errorf("%d effects answered 2xx twice with no notifier or NATS death, full disk or receiver link fault between the two; e.g. %v", n, er.Examples)
	}
	dead := p.deadLetters(ctx)
	if dead > 0 {
		t.Errorf("%d dead letters", dead)
	}

	t.Log("\n" + faultMatrix(faults, sr, er))
	t.Log("\n" + summary(summaryFigures{cfg: cfg, faults: faults, loadTime: loadTime, load: l, writes: writes,
		lost: nLost, toVerify: toVerify, verified: verifyErr == nil, toDrain: toDrain, drained: drainErr == nil,
		outbox: len(st.events), docs: len(st.docs), stream: sr, effects: er, dead: dead, p: p, backlog: backlog}))
}

// indexStore names the index projector's store.
func (c runConfig) indexStore() string {
	if c.qdrant != nil {
		return "in Qdrant collection " + c.qdrant.Collection + " at " + c.qdrant.URL
	}
	return "embedded"
}

func short(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}
