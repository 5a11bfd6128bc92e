// Package rebuildtest runs a projector process in a test: the live
// runtime over a [rebuild.Switch] on the live generation of some stores,
// and the [rebuild.Manager], as [rebuild.RunService] does without the
// HTTP side.
package rebuildtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Process is a running projector process.
type Process struct {
	Switch  *rebuild.Switch
	Manager *rebuild.Manager
	// Metrics are the live runtime's (its retries, events, ...).
	Metrics *projector.Metrics
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// Start opens the live generation of stores and runs the live runtime
// (configured by cfg) and the rebuild manager on js until Stop.
func Start(t testing.TB, js jetstream.JetStream, stores rebuild.Stores, cfg projector.Config) *Process {
	t.Helper()
	return StartWith(t, js, stores, rebuild.Config{Runtime: cfg})
}

// StartWith is Start with the manager's whole configuration, the live
// runtime's its Runtime.
func StartWith(t testing.TB, js jetstream.JetStream, stores rebuild.Stores, mc rebuild.Config) *Process {
	t.Helper()
	cfg := mc.Runtime
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{cancel: cancel}
	live, err := stores.Live(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	g, err := stores.Open(ctx, live)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	p.Switch = rebuild.NewSwitch(g)
	if p.Manager, err = rebuild.NewManager(mc, stores, p.Switch, nil); err != nil {
		p.Stop()
		t.Fatal(err)
	}
	p.Metrics = projector.NewMetrics(nil)
	rt, err := projector.New(js, p.Switch, cfg, p.Metrics, nil)
	if err != nil {
		p.Stop()
		t.Fatal(err)
	}
	p.done.Add(2)
	go func() { defer p.done.Done(); _ = rt.Run(ctx) }()
	go func() { defer p.done.Done(); _ = p.Manager.Run(ctx, js) }()
	return p
}

// Stop ends the process as a crash would, as far as the stores can tell:
// nothing is finished or cleaned up beyond closing the live generation.
func (p *Process) Stop() {
	p.cancel()
	p.done.Wait()
	if p.Switch != nil {
		_ = p.Switch.Close()
	}
}

// StartRebuild starts a rebuild as soon as the manager takes one (not
// while it is still connecting) and returns its status; the test fails if
// it does not start.
func (p *Process) StartRebuild(t testing.TB) rebuild.Status {
	t.Helper()
	ctx := context.Background()
	var st rebuild.Status
	testenv.Eventually(t, "the rebuild manager to be ready", 30*time.Second, func() bool {
		var started bool
		var err error
		st, started, err = p.Manager.Start(ctx)
		if err != nil && p.Manager.Status(ctx).Phase == rebuild.PhaseStarting {
			return false
		}
		if err != nil || !started {
			t.Fatalf("start a rebuild: started %v, %v", started, err)
		}
		return true
	})
	return st
}

// WaitDone waits until the manager reports rebuild id done.
func (p *Process) WaitDone(t testing.TB, id string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, "rebuild "+id+" to finish", timeout, func() bool {
		s := p.Manager.Status(context.Background())
		return s.Phase == rebuild.PhaseDone && s.ID == id
	})
}

// Stream starts an embedded NATS server with the documents' stream
// (CONVERGE_DOCS, file storage) for the test, and returns its JetStream.
func Stream(t testing.TB) jetstream.JetStream {
	t.Helper()
	_, js := testenv.StartNATS(t).DocsStream(t)
	return js
}

// Event is the upsert of key at version, a one-chunk body naming both.
func Event(t testing.TB, key string, version int64) contract.Event {
	t.Helper()
	e, err := event(key, version)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func event(key string, version int64) (contract.Event, error) {
	d, err := contract.Document{Key: key, Version: version, Title: "t",
		Body: fmt.Sprintf("body of %s at version %d", key, version)}.Normalize()
	if err != nil {
		return contract.Event{}, err
	}
	return contract.NewUpsertedEvent(d, []string{d.Body}), nil
}

// Publish publishes Event(key, version) on its subject. A failure is
// reported with t.Error, so that traffic goroutines may call it.
func Publish(t testing.TB, js jetstream.JetStream, key string, version int64) {
	t.Helper()
	e, err := event(key, version)
	if err != nil {
		t.Error(err)
		return
	}
	PublishEvent(t, js, e)
}

// PublishEvent publishes e on its document's subject, reporting a failure
// with t.Error.
func PublishEvent(t testing.TB, js jetstream.JetStream, e contract.Event) {
	t.Helper()
	data, err := e.Encode()
	if err != nil {
		t.Error(err)
		return
	}
	m := nats.NewMsg(contract.Subject(e.Key))
	m.Data = data
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Error(err)
	}
}

// LastVersions is the last version of every key in the documents' stream.
func LastVersions(t testing.TB, js jetstream.JetStream) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	stream, err := js.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	st := stream.CachedInfo().State
	out := map[string]int64{}
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := contract.DecodeEvent(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out[ev.Key] = max(out[ev.Key], ev.Version)
	}
	return out
}

// Traffic publishes live traffic until the returned stop is called (more
// than once is fine): new versions of doc-000 .. doc-<docs-1>, except
// doc-<damaged> (left as it is, for a rebuild alone to restore), and new
// documents new-0000, new-0001, ..., about one of each every 2 ms.
func Traffic(t testing.TB, js jetstream.JetStream, docs, damaged int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if i%docs != damaged {
				Publish(t, js, fmt.Sprintf("doc-%03d", i%docs), int64(2+i/docs))
			}
			Publish(t, js, fmt.Sprintf("new-%04d", i), 1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
}

// Leave writes st as the state of projector name's rebuild in the
// rebuilds' bucket, as a process that died during it leaves it.
func Leave(t testing.TB, js jetstream.JetStream, name string, st rebuild.State) {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), rebuild.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), name, b); err != nil {
		t.Fatal(err)
	}
}
