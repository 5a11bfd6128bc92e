package rebuild_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/testenv"
)

// serve serves m's routes as a projector's metrics address does.
func serve(t *testing.T, m *rebuild.Manager) *rebuild.Client {
	t.Helper()
	mux := http.NewServeMux()
	for p, h := range m.Routes() {
		mux.Handle(p, h)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &rebuild.Client{Addr: strings.TrimPrefix(srv.URL, "http://"), HTTP: srv.Client()}
}

func TestClientStartsAndFollowsARebuild(t *testing.T) {
	ctx := context.Background()
	js := rebuildtest.Stream(t)
	for i := range 20 {
		rebuildtest.Publish(t, js, "doc-"+string(rune('a'+i)), 1)
	}
	stores, err := indexprojector.NewStores(ctx, &indexprojector.Config{DataDir: t.TempDir()}, index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := rebuildtest.Start(t, js, stores, projector.Config{Name: "index", BatchSize: 8})
	t.Cleanup(func() { p.Stop(); _ = stores.Close() })
	c := serve(t, p.Manager)

	var st rebuild.Status
	var started bool
	testenv.Eventually(t, "the rebuild manager to be ready", 30*time.Second, func() bool {
		st, started, err = c.Start(ctx)
		var apiErr *rebuild.APIError
		if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusServiceUnavailable && apiErr.Code == "rebuild_unavailable" {
			return false
		}
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		return true
	})
	if !started || st.ID == "" || st.Projector != "index" || st.InPlace || st.Target == "" || st.Previous == "" {
		t.Fatalf("start: started %v, %+v", started, st)
	}
	var seen []rebuild.Status
	done, err := c.Wait(ctx, st.ID, 5*time.Millisecond, func(s rebuild.Status, err error) {
		if err != nil {
			t.Errorf("a poll failed: %v", err)
			return
		}
		seen = append(seen, s)
	})
	if err != nil {
		t.Fatal(err)
	}
	if done.Phase != rebuild.PhaseDone || done.ID != st.ID || done.Target != st.Target || len(seen) == 0 || seen[len(seen)-1].Phase != rebuild.PhaseDone {
		t.Fatalf("done %+v after %d statuses", done, len(seen))
	}
	now, err := c.Status(ctx)
	if err != nil || now.ID != st.ID || now.Phase != rebuild.PhaseDone || now.Completed != 1 {
		t.Fatalf("status after the rebuild: %+v, %v", now, err)
	}
}

// A manager still connecting to NATS refuses a start with the API's error,
// and reports itself starting.
func TestClientErrorOfAManagerNotReady(t *testing.T) {
	ctx := context.Background()
	stores, err := indexprojector.NewStores(ctx, &indexprojector.Config{DataDir: t.TempDir()}, index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stores.Close() })
	m, err := rebuild.NewManager(rebuild.Config{Runtime: projector.Config{Name: "index"}}, stores, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, m)
	_, started, err := c.Start(ctx)
	var apiErr *rebuild.APIError
	if started || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "rebuild_unavailable" ||
		!strings.Contains(apiErr.Message, "not ready") || !strings.Contains(err.Error(), "rebuild_unavailable: ") {
		t.Fatalf("start before the manager is ready: %v, %v", started, err)
	}
	if st, err := c.Status(ctx); err != nil || st.Phase != rebuild.PhaseStarting {
		t.Fatalf("status before the manager is ready: %+v, %v", st, err)
	}
	if _, err := (&rebuild.Client{Addr: "127.0.0.1:1"}).Status(ctx); err == nil || errors.As(err, &apiErr) {
		t.Fatalf("status of no projector: %v, want a connection error", err)
	}
}

// scripted answers each GET with the next step of a script, as a
// projector that restarts and resumes would; a step with code >= 400 is an
// error answer.
type step struct {
	code int
	st   rebuild.Status
}

func scripted(t *testing.T, gets ...step) *rebuild.Client {
	t.Helper()
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != rebuild.AdminPath || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if len(gets) == 0 {
			t.Error("GET after the end of the script")
			http.Error(w, "no more", http.StatusInternalServerError)
			return
		}
		s := gets[0]
		gets = gets[1:]
		if s.code >= 400 {
			httpjson.Error(w, s.code, "rebuild_unavailable", "not ready yet")
			return
		}
		httpjson.Write(w, http.StatusOK, s.st)
	}))
	t.Cleanup(srv.Close)
	return &rebuild.Client{Addr: strings.TrimPrefix(srv.URL, "http://"), HTTP: srv.Client()}
}

func TestClientWaitsThroughARestart(t *testing.T) {
	filling := rebuild.Status{Projector: "index", ID: "r1", Phase: rebuild.PhaseFilling, Target: "index-b", Previous: "index", StreamLastSeq: 100, AppliedSeq: 40, Pending: 60}
	done := filling
	done.Phase, done.AppliedSeq, done.Pending = rebuild.PhaseDone, 100, 0
	c := scripted(t,
		step{0, filling},
		step{http.StatusServiceUnavailable, rebuild.Status{}}, // restarting
		step{0, rebuild.Status{Projector: "index", Phase: rebuild.PhaseStarting}},
		step{0, filling},
		step{0, done})
	var phases []string
	var failed int
	st, err := c.Wait(context.Background(), "r1", time.Millisecond, func(s rebuild.Status, err error) {
		if err != nil {
			failed++
			return
		}
		phases = append(phases, s.Phase)
	})
	if err != nil || st.Phase != rebuild.PhaseDone || st.ID != "r1" || st.AppliedSeq != 100 {
		t.Fatalf("wait: %+v, %v", st, err)
	}
	if failed != 1 || strings.Join(phases, " ") != "filling filling done" {
		t.Fatalf("progress: %d failed polls, phases %v; want 1 and the starting phase skipped", failed, phases)
	}
}

// A projector restarted after the rebuild finished has no state left: the
// rebuild is done (its state is deleted last).
func TestClientWaitDoneAcrossRestart(t *testing.T) {
	c := scripted(t, step{0, rebuild.Status{Projector: "graph", Phase: rebuild.PhaseIdle}})
	st, err := c.Wait(context.Background(), "r2", time.Millisecond, nil)
	if err != nil || st.Phase != rebuild.PhaseDone || st.ID != "r2" {
		t.Fatalf("wait: %+v, %v; want r2 done", st, err)
	}
}

func TestClientWaitRefusesAnotherRebuild(t *testing.T) {
	c := scripted(t, step{0, rebuild.Status{Projector: "index", ID: "r4", Phase: rebuild.PhaseFilling}})
	if _, err := c.Wait(context.Background(), "r3", time.Millisecond, nil); err == nil || !strings.Contains(err.Error(), "rebuild r4, not r3") {
		t.Fatalf("another rebuild reported: %v; want an error naming it", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Wait(ctx, "r3", time.Hour, nil); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "goes on in the projector") {
		t.Fatalf("a canceled wait: %v", err)
	}
}
