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
	st, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, time.Millisecond, &progress)
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
	// Not on a terminal, progress is plain lines: no line rewritten with
	// "\r" into one a log shows as a pile.
	if strings.Contains(progress.String(), "\r") || !strings.HasSuffix(progress.String(), "\n") {
		t.Errorf("progress to a buffer rewrites lines:\n%q", progress.String())
	}
	if n := strings.Count(progress.String(), "applied 40 of 100"); n != 1 {
		t.Errorf("an unchanged status was written %d times:\n%s", n, progress.String())
	}
}

func TestRunRebuildErrors(t *testing.T) {
	srv := scriptedProjector(t, step{http.StatusServiceUnavailable, rebuild.Status{}})
	_, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, time.Millisecond, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "rebuild_unavailable: not ready yet") {
		t.Fatalf("refused start: %v; want the projector's error", err)
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
