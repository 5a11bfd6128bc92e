// Package rebuildtest runs a projector process in a test: the live
// runtime over a [rebuild.Switch] on the live generation of some stores,
// and the [rebuild.Manager], as [rebuild.RunService] does without the
// HTTP side.
package rebuildtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
)

// Process is a running projector process.
type Process struct {
	Switch  *rebuild.Switch
	Manager *rebuild.Manager
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// Start opens the live generation of stores and runs the live runtime
// (configured by cfg) and the rebuild manager on js until Stop.
func Start(t testing.TB, js jetstream.JetStream, stores rebuild.Stores, cfg projector.Config) *Process {
	t.Helper()
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
	if p.Manager, err = rebuild.NewManager(rebuild.Config{Runtime: cfg}, stores, p.Switch, nil); err != nil {
		p.Stop()
		t.Fatal(err)
	}
	rt, err := projector.New(js, p.Switch, cfg, nil, nil)
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

// WaitDone waits until the manager reports rebuild id done.
func (p *Process) WaitDone(t testing.TB, id string, timeout time.Duration) {
	t.Helper()
	Eventually(t, "rebuild "+id+" to finish", timeout, func() bool {
		s := p.Manager.Status(context.Background())
		return s.Phase == rebuild.PhaseDone && s.ID == id
	})
}

// Eventually polls cond until it holds, failing the test after timeout.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
