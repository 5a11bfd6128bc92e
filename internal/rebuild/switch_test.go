package rebuild

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

type countStore struct{ calls atomic.Int64 }

func (s *countStore) Apply(_ context.Context, events []*contract.Event) []projector.Result {
	s.calls.Add(1)
	return make([]projector.Result, len(events))
}

func generation(name string, store projector.Store, closed *atomic.Bool) *Generation {
	return &Generation{
		Name:  name,
		Store: store,
		Routes: map[string]http.Handler{"GET /which": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, name)
		})},
		Close: func() error { closed.Store(true); return nil },
	}
}

// Pause holds Apply back until resumed; replace moves writes and reads to
// the new generation, and the old one is closed once.
func TestSwitch(t *testing.T) {
	var closedA, closedB atomic.Bool
	a, b := &countStore{}, &countStore{}
	sw := NewSwitch(generation("a", a, &closedA))
	mux := http.NewServeMux()
	for p, h := range sw.Routes() {
		mux.Handle(p, h)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	which := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL + "/which")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := which(); got != "a" {
		t.Fatalf("reads from %q; want a", got)
	}

	resume := sw.Pause()
	done := make(chan struct{})
	go func() {
		sw.Apply(context.Background(), []*contract.Event{{Key: "k"}})
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("Apply ran while the switch was paused")
	case <-time.After(100 * time.Millisecond):
	}
	prev := sw.replace(generation("b", b, &closedB))
	resume()
	<-done
	if a.calls.Load() != 0 || b.calls.Load() != 1 {
		t.Fatalf("held-back Apply went to a %d times, b %d times; want only b", a.calls.Load(), b.calls.Load())
	}
	if got := which(); got != "b" {
		t.Fatalf("reads after the swap from %q; want b", got)
	}
	if err := prev.close(); err != nil || !closedA.Load() {
		t.Fatalf("closing the previous generation: %v, closed %v", err, closedA.Load())
	}
	closedA.Store(false)
	if err := prev.close(); err != nil || closedA.Load() {
		t.Fatal("a generation was closed twice")
	}
	resume() // a second call is harmless
	if err := sw.Close(); err != nil || !closedB.Load() {
		t.Fatalf("Close: %v, closed %v", err, closedB.Load())
	}
}
