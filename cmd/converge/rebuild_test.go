package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/rebuild"
)

// scriptedProjector answers POST with the first status and each GET with
// the next step of the script; a step with code != 0 is an error answer.
type step struct {
	code int
	st   rebuild.Status
}

func scriptedProjector(t *testing.T, post step, gets ...step) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != rebuild.AdminPath {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		s := post
		if r.Method == http.MethodGet {
			if len(gets) == 0 {
				mu.Unlock()
				t.Error("GET after the end of the script")
				http.Error(w, "no more", http.StatusInternalServerError)
				return
			}
			s, gets = gets[0], gets[1:]
		}
		mu.Unlock()
		if s.code >= 400 {
			httpjson.Error(w, s.code, "rebuild_unavailable", "not ready yet")
			return
		}
		httpjson.Write(w, max(s.code, http.StatusOK), s.st)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRunRebuildFollowsProgressThroughARestart(t *testing.T) {
	filling := rebuild.Status{Projector: "index", ID: "r1", Phase: rebuild.PhaseFilling, Target: "index-b", Previous: "index", StreamLastSeq: 100, AppliedSeq: 40, Pending: 60}
	done := filling
	done.Phase, done.AppliedSeq, done.Pending = rebuild.PhaseDone, 100, 0
	srv := scriptedProjector(t, step{http.StatusAccepted, filling},
		step{0, filling},
		step{http.StatusServiceUnavailable, rebuild.Status{}}, // restarting
		step{0, rebuild.Status{Projector: "index", Phase: rebuild.PhaseStarting}},
		step{0, filling},
		step{0, done})
	var progress bytes.Buffer
	st, err := runRebuild(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"), time.Millisecond, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != rebuild.PhaseDone || st.ID != "r1" || st.Target != "index-b" {
		t.Fatalf("final status %+v", st)
	}
	for _, want := range []string{"blue/green into index-b while index stays live", "applied 40 of 100 (pending 60)", "rebuild_unavailable", "applied 100 of 100"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}

// A projector restarted after the rebuild finished has no state left: the
// rebuild is done (its state is deleted last).
func TestRunRebuildDoneAcrossRestart(t *testing.T) {
	filling := rebuild.Status{Projector: "graph", ID: "r2", Phase: rebuild.PhaseWiping, InPlace: true, Target: "neo4j"}
	srv := scriptedProjector(t, step{http.StatusAccepted, filling}, step{0, rebuild.Status{Projector: "graph", Phase: rebuild.PhaseIdle}})
	st, err := runRebuild(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"), time.Millisecond, &bytes.Buffer{})
	if err != nil || st.Phase != rebuild.PhaseDone || st.ID != "r2" {
		t.Fatalf("runRebuild: %+v, %v; want r2 done", st, err)
	}
}

func TestRunRebuildErrors(t *testing.T) {
	srv := scriptedProjector(t, step{http.StatusServiceUnavailable, rebuild.Status{}})
	_, err := runRebuild(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"), time.Millisecond, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "rebuild_unavailable: not ready yet") {
		t.Fatalf("refused start: %v; want the projector's error", err)
	}
	other := rebuild.Status{Projector: "index", ID: "r3", Phase: rebuild.PhaseFilling}
	srv = scriptedProjector(t, step{http.StatusAccepted, other}, step{0, rebuild.Status{Projector: "index", ID: "r4", Phase: rebuild.PhaseFilling}})
	_, err = runRebuild(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"), time.Millisecond, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "r4") {
		t.Fatalf("another rebuild reported: %v; want an error naming it", err)
	}
	for _, args := range [][]string{{}, {"everything"}, {"index", "extra"}} {
		if err := rebuildCmd(context.Background(), args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "converge rebuild index") {
			t.Errorf("rebuild %v: %v; want the usage", args, err)
		}
	}
	t.Setenv("CONVERGE_POSTGRES_URL", "")
	if err := rebuildCmd(context.Background(), []string{"graph"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "postgres-url") {
		t.Errorf("rebuild without -postgres-url: %v", err)
	}
}
