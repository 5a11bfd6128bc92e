package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
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
	st, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, -1, time.Millisecond, &progress)
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
	_, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, -1, time.Millisecond, &bytes.Buffer{})
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

// converge rebuild -partition P asks for that partition's rebuild, and
// follows it; a rebuild in progress of another partition, or of one when
// the whole store was asked for, is an error naming it, not followed as
// if it were the one asked for.
func TestRunRebuildOfOnePartition(t *testing.T) {
	two, one := 2, 1
	filling := rebuild.Status{Projector: "graph", ID: "r2", Phase: rebuild.PhaseFilling, InPlace: true, Target: "neo4j", Previous: "neo4j", Partition: &two, Partitions: 4}
	done := filling
	done.Phase = rebuild.PhaseDone
	var (
		mu    sync.Mutex
		asked []string
	)
	serve := func(post rebuild.Status, gets ...rebuild.Status) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if r.Method == http.MethodPost {
				asked = append(asked, r.URL.RawQuery)
				httpjson.Write(w, http.StatusAccepted, post)
				return
			}
			if len(gets) == 0 {
				t.Error("GET after the end of the script")
				http.Error(w, "no more", http.StatusInternalServerError)
				return
			}
			httpjson.Write(w, http.StatusOK, gets[0])
			gets = gets[1:]
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	srv := serve(filling, done)
	var progress bytes.Buffer
	st, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, 2, time.Millisecond, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != rebuild.PhaseDone || st.Partition == nil || *st.Partition != 2 {
		t.Fatalf("final status %+v", st)
	}
	if len(asked) != 1 || asked[0] != "partition=2" {
		t.Errorf("the rebuild was asked with %q, want partition=2", asked)
	}
	if !strings.Contains(progress.String(), "partition 2 of 4 in place") {
		t.Errorf("progress does not say which partition:\n%s", progress.String())
	}

	// Abandoned (the partitions made anew meanwhile): an error saying so.
	abandoned := done
	abandoned.Abandoned = "the partitioned stream now has 8 partitions, not 4"
	srv = serve(filling, abandoned)
	if _, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, 2, time.Millisecond, &bytes.Buffer{}); err == nil ||
		!strings.Contains(err.Error(), "rebuild r2 of partition 2 of 4 was abandoned: the partitioned stream now has 8 partitions") {
		t.Errorf("an abandoned rebuild: %v; want an error saying why", err)
	}
	if err := rebuildCmd(context.Background(), []string{"graph", "-partition", "-2", "-no-verify"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-partition -2") {
		t.Errorf("rebuild -partition -2: %v; want a usage error, never a rebuild of the whole store", err)
	}

	other := filling
	other.Partition = &one
	for _, c := range []struct {
		asked int
		want  string
	}{
		{2, "rebuild r2 of partition 1 is in progress on graph, not one of partition 2"},
		{-1, "rebuild r2 of partition 1 is in progress on graph, not one of the whole store"},
	} {
		srv := serve(other)
		if _, err := runRebuild(context.Background(), &rebuild.Client{Addr: srv.URL, HTTP: srv.Client()}, c.asked, time.Millisecond, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("asked for partition %d with another's rebuild in progress: %v; want %q", c.asked, err, c.want)
		}
	}
}

// The verify at the end of a partition's rebuild speaks of that
// partition: another partition's differences leave it agreeing, its own
// do not; a rebuild of the whole keeps every difference.
func TestRebuiltPartIsThePartitionsVerify(t *testing.T) {
	const parts = 4
	var here, elsewhere string
	for i := 0; here == "" || elsewhere == ""; i++ {
		key := fmt.Sprintf("doc-%d", i)
		if contract.Partition(key, parts) == 1 {
			here = key
		} else {
			elsewhere = key
		}
	}
	one := 1
	st := rebuild.Status{Partition: &one, Partitions: parts}
	other := verify.Report{Store: "graph", Agrees: false, Differences: []verify.Difference{{Key: elsewhere}}}
	if r := rebuiltPart(other, st); !r.Agrees || len(r.Differences) != 0 || r.Partition == nil || *r.Partition != 1 || r.Partitions != parts {
		t.Errorf("another partition's difference: %+v; want partition 1 of 4 agreeing", r)
	}
	mine := verify.Report{Store: "graph", Agrees: false, Differences: []verify.Difference{{Key: elsewhere}, {Key: here}}}
	if r := rebuiltPart(mine, st); r.Agrees || len(r.Differences) != 1 || r.Differences[0].Key != here {
		t.Errorf("the partition's own difference: %+v; want it alone, disagreeing", r)
	}
	if r := rebuiltPart(mine, rebuild.Status{}); r.Agrees || len(r.Differences) != 2 || r.Partition != nil {
		t.Errorf("a whole rebuild's verify: %+v; want every difference", r)
	}
}
