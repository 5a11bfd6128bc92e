package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"

	"github.com/converge-sync/converge/pkg/contract"
)

type env struct {
	js      jetstream.JetStream
	dataDir string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{js: rebuildtest.Stream(t), dataDir: t.TempDir()}
}

func (e *env) publish(t testing.TB, key string, version int64) {
	t.Helper()
	rebuildtest.Publish(t, e.js, key, version)
}

// process is one index projector process on the embedded index.
type process struct {
	*rebuildtest.Process
	stores *indexprojector.Stores
}

func start(t *testing.T, e *env) *process { return startWith(t, e, nil) }

// startWith starts a process whose rebuild manager sees the stores through
// wrap (nil: as they are).
func startWith(t *testing.T, e *env, wrap func(*indexprojector.Stores) rebuild.Stores) *process {
	t.Helper()
	stores, err := indexprojector.NewStores(context.Background(), &indexprojector.Config{DataDir: e.dataDir}, index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen rebuild.Stores = stores
	if wrap != nil {
		seen = wrap(stores)
	}
	return &process{Process: rebuildtest.Start(t, e.js, seen, projector.Config{Name: "index", BatchSize: 64}), stores: stores}
}

// failingDrop are stores on which dropping one generation fails.
type failingDrop struct {
	*indexprojector.Stores
	name string
}

func (f failingDrop) Drop(ctx context.Context, name string) error {
	if name == f.name {
		return fmt.Errorf("dropping %s fails in this test", name)
	}
	return f.Stores.Drop(ctx, name)
}

func (p *process) stop() {
	p.Stop()
	_ = p.stores.Close()
}

// versions is what the live generation holds: key -> version.
func (p *process) versions(t *testing.T) map[string]int64 {
	t.Helper()
	x := p.Switch.Live().Store.(*index.Index)
	docs, err := verify.ReadIndex(context.Background(), x.Backend().(index.Backend))
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(docs))
	for _, d := range docs {
		if len(d.Chunks) == 0 {
			t.Errorf("%s at version %d has no chunks", d.Key, d.Version)
		}
		out[d.Key] = d.Version
	}
	return out
}

func holdsAll(p *process, t *testing.T, want map[string]int64) func() bool {
	return func() bool {
		got := p.versions(t)
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
}

// A blue/green rebuild while events keep arriving: the rebuilt generation
// replaces the live one (which was damaged behind the projector's back, so
// only a rebuild from scratch restores it), the previous one is dropped,
// and no event is lost on either side of the swap.
func TestBlueGreenRebuildUnderLiveTraffic(t *testing.T) {
	e := newEnv(t)
	p := start(t, e)
	defer p.stop()
	want := map[string]int64{}
	for i := range 300 {
		key := fmt.Sprintf("doc-%03d", i)
		e.publish(t, key, 1)
		want[key] = 1
	}
	testenv.Eventually(t, "the live index to hold 300 documents", 30*time.Second, holdsAll(p, t, want))

	// Damage behind the projector's back: the points of doc-007 go, its
	// marker stays, so the projector skips its events from now on.
	first := p.Switch.Live()
	x := first.Store.(*index.Index)
	if err := x.Backend().DeleteStale(context.Background(), []index.Keep{{Key: "doc-007", Version: 0}}); err != nil {
		t.Fatal(err)
	}

	// Live traffic during the whole rebuild; doc-007 stays damaged.
	stopTraffic := rebuildtest.Traffic(t, e.js, 300, 7)
	defer stopTraffic()

	reg := prometheus.NewRegistry()
	if err := p.Manager.Register(reg); err != nil {
		t.Fatal(err)
	}
	st := p.StartRebuild(t)
	if got := gauge(t, reg, "converge_rebuild_in_progress"); got != 1 {
		t.Errorf("converge_rebuild_in_progress = %v during the rebuild", got)
	}
	if _, again, err := p.Manager.Start(context.Background()); err != nil || again {
		t.Fatalf("a second Start while one runs: started %v, %v; want the running one", again, err)
	}
	if st.Previous != "index" || st.Target == "index" || st.InPlace {
		t.Fatalf("rebuild status %+v: want blue/green from index", st)
	}
	p.WaitDone(t, st.ID, 60*time.Second)
	stopTraffic()

	// What was published: the last version of every key.
	want = rebuildtest.LastVersions(t, e.js)
	testenv.Eventually(t, "the rebuilt index to hold every key at its last version", 30*time.Second, holdsAll(p, t, want))

	live := p.Switch.Live()
	if live.Name != st.Target || live == first {
		t.Fatalf("live generation %q; want the rebuilt %q", live.Name, st.Target)
	}
	if name, err := os.ReadFile(filepath.Join(e.dataDir, "index.current")); err != nil || string(name) != st.Target+"\n" {
		t.Fatalf("pointer file: %q, %v; want %q", name, err, st.Target)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "index")); !os.IsNotExist(err) {
		t.Errorf("the previous generation's directory remains: %v", err)
	}
	if _, err := e.js.Consumer(context.Background(), contract.DocsStream, rebuild.ConsumerName("index")); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the rebuild consumer remains: %v", err)
	}
	kv, err := e.js.KeyValue(context.Background(), rebuild.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if ent, err := kv.Get(context.Background(), "index"); err != nil || !strings.Contains(string(ent.Value()), `"phase":"done"`) || !strings.Contains(string(ent.Value()), `"done_at"`) {
		t.Errorf("the rebuild state after the rebuild: %v; want it ended, with its end's time", err)
	} else if states, err := rebuild.InProgress(context.Background(), e.js); err != nil || len(states) != 0 {
		t.Errorf("rebuilds in progress after the rebuild: %+v, %v", states, err)
	}
	if s := p.Manager.Status(context.Background()); s.Completed != 1 || s.DoneAt == nil {
		t.Errorf("status after the rebuild: %+v", s)
	}
	for name, want := range map[string]float64{"converge_rebuild_in_progress": 0, "converge_rebuild_pending_events": 0, "converge_rebuilds_completed_total": 1} {
		if got := gauge(t, reg, name); got != want {
			t.Errorf("%s = %v after the rebuild, want %v", name, got, want)
		}
	}
}

// gauge is the value of the metric name on reg (a gauge or a counter).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		m := f.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("%s is not exported", name)
	return 0
}

// startRebuild publishes docs documents, starts a process, waits until its
// live index holds them all, and starts a rebuild.
func startRebuild(t *testing.T, e *env, docs int) (*process, rebuild.Status, map[string]int64) {
	t.Helper()
	want := map[string]int64{}
	for i := range docs {
		key := fmt.Sprintf("doc-%04d", i)
		e.publish(t, key, 1)
		want[key] = 1
	}
	p := start(t, e)
	testenv.Eventually(t, "the live index to hold every document", 60*time.Second, holdsAll(p, t, want))
	return p, p.StartRebuild(t), want
}

// A process stopped in the middle of a rebuild resumes it when it starts
// again: into the same fresh generation, from the rebuild consumer's
// position, to the same end.
func TestRebuildResumesAfterRestart(t *testing.T) {
	e := newEnv(t)
	const docs = 3000
	p, st, want := startRebuild(t, e, docs)
	var applied uint64
	testenv.Eventually(t, "the rebuild to be under way", 30*time.Second, func() bool {
		s := p.Manager.Status(context.Background())
		applied = s.AppliedSeq
		return s.Phase == rebuild.PhaseDone || applied > 0
	})
	if p.Manager.Status(context.Background()).Phase == rebuild.PhaseDone {
		t.Skip("the rebuild finished before it could be interrupted")
	}
	p.stop()
	if _, err := os.Stat(filepath.Join(e.dataDir, st.Target)); err != nil {
		t.Fatalf("the interrupted rebuild's generation: %v", err)
	}

	p = start(t, e)
	defer p.stop()
	if s := p.Manager.Status(context.Background()); s.ID != st.ID && s.Phase != rebuild.PhaseStarting {
		t.Errorf("status of the restarted process: %+v; want rebuild %s reported", s, st.ID)
	}
	p.WaitDone(t, st.ID, 60*time.Second)
	if live := p.Switch.Live().Name; live != st.Target {
		t.Fatalf("live generation after the resumed rebuild: %q; want %q (the same target)", live, st.Target)
	}
	testenv.Eventually(t, "the rebuilt index to hold every document", 30*time.Second, holdsAll(p, t, want))
	if _, err := os.Stat(filepath.Join(e.dataDir, "index")); !os.IsNotExist(err) {
		t.Errorf("the previous generation's directory remains: %v", err)
	}
	t.Logf("interrupted after the rebuild consumer had acknowledged up to %d of %d", applied, docs)
}

// A rebuild resumed on a process whose live generation is not the one
// recorded when the rebuild began (here the pointer file was moved while
// no process ran; with Qdrant, a restart between dropping a legacy
// collection and creating its alias opens a fresh first collection)
// drops that generation too, not only the recorded one; and so does a
// process started after a crash that came between the switch and that
// drop, from what the rebuild recorded before switching.
func TestResumedRebuildDropsTheGenerationLiveAtTheSwitch(t *testing.T) {
	e := newEnv(t)
	p, st, want := startRebuild(t, e, 3000)
	p.stop()
	if st.Previous != "index" {
		t.Fatalf("recorded previous generation %q, want index", st.Previous)
	}
	if p.Manager.Status(context.Background()).Phase == rebuild.PhaseDone {
		t.Skip("the rebuild finished before it could be interrupted")
	}
	dirs := rebuild.Dirs{Root: e.dataDir, Base: "index"}
	const since = "index-opened-since"
	if err := os.Mkdir(dirs.Path(since), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := dirs.Activate(since); err != nil {
		t.Fatal(err)
	}

	// The restarted process switches, then fails to drop the generation it
	// was found on, and stops there.
	p = startWith(t, e, func(s *indexprojector.Stores) rebuild.Stores { return failingDrop{Stores: s, name: since} })
	if live := p.Switch.Live().Name; live != since {
		t.Fatalf("the restarted process runs on %q; want %q", live, since)
	}
	testenv.Eventually(t, "the resumed rebuild to switch and fail to drop "+since, 60*time.Second, func() bool {
		s := p.Manager.Status(context.Background())
		return s.Phase == rebuild.PhaseRetrying && strings.Contains(s.Error, "fails in this test")
	})
	if live := p.Switch.Live().Name; live != st.Target {
		t.Fatalf("live generation when the drop failed: %q; want the target %q", live, st.Target)
	}
	p.stop()

	p = start(t, e)
	defer func() { p.stop() }()
	p.WaitDone(t, st.ID, 60*time.Second)
	if live := p.Switch.Live().Name; live != st.Target {
		t.Fatalf("live generation after the resumed rebuild: %q; want %q", live, st.Target)
	}
	testenv.Eventually(t, "the rebuilt index to hold every document", 30*time.Second, holdsAll(p, t, want))
	for _, gone := range []string{"index", since} {
		if _, err := os.Stat(dirs.Path(gone)); !os.IsNotExist(err) {
			t.Errorf("generation %s remains after the rebuild: %v", gone, err)
		}
	}
}
