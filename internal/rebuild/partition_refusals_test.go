package rebuild_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/rebuild/rebuildtest"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
)

// wholeOnly are in-place stores that cannot wipe one partition.
type wholeOnly struct{ rebuild.InPlace }

// refusingGens refuse to have a partition rebuilt alone, as an index
// whose vectors are another embedder's does.
type refusingGens struct{ inPlaceGens }

func (refusingGens) PartitionRefused(*rebuild.Generation) error {
	return errors.New("the index refuses writes: its vectors are another embedder's")
}

// serveRebuilds runs a projector process on stores with the rebuild manager's
// routes served, once the manager is ready.
func serveRebuilds(t *testing.T, js jetstream.JetStream, stores rebuild.Stores, parts int) (*rebuildtest.Process, *rebuild.Client) {
	t.Helper()
	p := rebuildtest.StartWith(t, js, stores, rebuild.Config{Runtime: projector.Config{Name: "index"}, Partitions: parts, RetryMax: time.Second})
	t.Cleanup(p.Stop)
	mux := http.NewServeMux()
	for pattern, h := range p.Manager.Routes() {
		mux.Handle(pattern, h)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	testenv.Eventually(t, "the rebuild manager to be ready", 10*time.Second, func() bool {
		return p.Manager.Status(context.Background()).Phase != rebuild.PhaseStarting
	})
	return p, &rebuild.Client{Addr: srv.URL}
}

// A rebuild of one partition that cannot be is refused with 400
// invalid_partition, naming why, and nothing is started: a partition the
// projector does not have, an empty or unreadable one, a projector not in
// partitions, stores that cannot wipe one partition, and an index that
// refuses writes (a partition wiped would stay empty).
func TestPartitionRebuildRefusals(t *testing.T) {
	n := testenv.StartNATS(t)
	_, js := n.DocsStream(t)
	s := newSharedGens(true)
	ip := inPlaceGens{gens{s: s, instance: "a"}}
	refused := func(c *rebuild.Client, part int, want string) {
		t.Helper()
		_, started, err := c.StartPartition(context.Background(), part)
		ae, ok := errors.AsType[*rebuild.APIError](err)
		if started || !ok || ae.StatusCode != http.StatusBadRequest || ae.Code != "invalid_partition" || !strings.Contains(ae.Message, want) {
			t.Errorf("a rebuild of partition %d: started %v, %v; want 400 invalid_partition naming %q", part, started, err, want)
		}
	}
	_, c := serveRebuilds(t, js, ip, 4)
	refused(c, 4, "partitions 0 to 3")
	refused(c, -1, "partitions 0 to 3")
	for _, q := range []string{"", "abc", "2x"} {
		resp, err := http.Post(c.Addr+rebuild.AdminPath+"?partition="+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST ?partition=%s: %d, want 400 (never a rebuild of the whole store)", q, resp.StatusCode)
		}
	}
	_, c = serveRebuilds(t, js, ip, 0)
	refused(c, 1, "does not run in partitions")
	_, c = serveRebuilds(t, js, wholeOnly{ip}, 4)
	refused(c, 1, "cannot wipe one partition")
	_, c = serveRebuilds(t, js, refusingGens{ip}, 4)
	refused(c, 1, "another embedder's")
	if st, err := c.Status(context.Background()); err != nil || st.ID != "" {
		t.Errorf("after the refusals the projector reports %+v, %v; want no rebuild", st, err)
	}
	s.mu.Lock()
	wrote := len(s.wrote)
	s.mu.Unlock()
	if wrote != 0 {
		t.Errorf("the refusals wrote %d times to the store", wrote)
	}
}

// A rebuild of one partition left by a process that can no longer be
// done as begun ends so that nothing stays wiped and the next rebuild
// can run: abandoned where the partitioned stream was made anew (its
// consumers fill every document again); widened into a rebuild of the
// whole store where the partition may be wiped, even in part, and
// nothing would fill it again (the projector back to one writer), or
// where the index refuses writes (a whole rebuild is what replaces it). On an instance configured otherwise than the stream, it
// waits for one configured as the stream is. The outcome stays in the
// rebuilds' bucket: a process started afterwards reports it.
func TestPartitionRebuildThatCannotGoOnAsBegun(t *testing.T) {
	for _, c := range []struct {
		name                   string
		began, stream, running int
		phase                  string
		refusing               bool
		abandoned, widened     string // what the status says
		wiped                  bool   // the whole store wiped (widened)
	}{
		{"partitions made anew before the wipe", 4, 2, 2, rebuild.PhaseWiping, false, "made anew with 2 partitions, not 4", "", false},
		{"one writer now, during the wipe", 2, 2, 0, rebuild.PhaseWiping, false, "", "runs in 0 partitions now", true},
		{"partitions made anew after the wipe", 4, 2, 2, rebuild.PhaseFilling, false, "made anew with 2 partitions, not 4", "", false},
		{"one writer now, after the wipe", 2, 2, 0, rebuild.PhaseFilling, false, "", "runs in 0 partitions now", true},
		{"index refusing writes", 2, 2, 2, rebuild.PhaseWiping, true, "", "another embedder's", true},
		{"instance configured otherwise", 2, 2, 4, rebuild.PhaseWiping, false, "", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := testenv.StartNATS(t)
			_, js := n.DocsStream(t)
			if _, err := relay.ApplyPartsStream(context.Background(), js, relay.StreamConfig{}, c.stream, false); err != nil {
				t.Fatal(err)
			}
			s := newSharedGens(true)
			var stores rebuild.Stores = inPlaceGens{gens{s: s, instance: "a"}}
			if c.refusing {
				stores = refusingGens{inPlaceGens{gens{s: s, instance: "a"}}}
			}
			first, _ := serveRebuilds(t, js, stores, c.running) // makes the bucket
			first.Stop()
			part := 1
			rebuildtest.Leave(t, js, "index", rebuild.State{ID: "left", Phase: c.phase, InPlace: true, Target: "gen-0", Previous: "gen-0",
				Partition: &part, Partitions: c.began, StartedAt: time.Now().UTC()})
			p, _ := serveRebuilds(t, js, stores, c.running)
			if c.abandoned == "" && c.widened == "" {
				testenv.Eventually(t, "the rebuild to wait for an instance configured as the stream", 10*time.Second, func() bool {
					st := p.Manager.Status(context.Background())
					return st.Phase == rebuild.PhaseRetrying && strings.Contains(st.Error, "run it with 2")
				})
				if st, err := rebuild.InProgress(context.Background(), js); err != nil || len(st) != 1 {
					t.Errorf("the rebuilds in progress: %+v, %v; want it kept", st, err)
				}
				if wipes := s.wipes(); wipes != 0 {
					t.Errorf("%d wipes; want none", wipes)
				}
				return
			}
			testenv.Eventually(t, "the rebuild to end", 10*time.Second, func() bool {
				st := p.Manager.Status(context.Background())
				return st.Phase == rebuild.PhaseDone && st.ID == "left"
			})
			// An abandoned rebuild is not counted completed.
			if got, want := p.Manager.Status(context.Background()).Completed, map[bool]int{true: 0, false: 1}[c.abandoned != ""]; got != want {
				t.Errorf("rebuilds completed: %d, want %d", got, want)
			}
			p.Stop()
			// Reported by a process started afterwards, from the bucket.
			again, _ := serveRebuilds(t, js, stores, c.running)
			st := again.Manager.Status(context.Background())
			if st.Phase != rebuild.PhaseDone || st.ID != "left" || st.DoneAt == nil || !strings.Contains(st.Abandoned, c.abandoned) ||
				!strings.Contains(st.Widened, c.widened) || (c.abandoned == "") != (st.Abandoned == "") || (c.widened == "") != (st.Widened == "") {
				t.Errorf("status after the end: %+v; want done, abandoned %q, widened %q", st, c.abandoned, c.widened)
			}
			if c.widened != "" && st.Partition != nil {
				t.Errorf("a widened rebuild reports partition %d", *st.Partition)
			}
			if states, err := rebuild.InProgress(context.Background(), js); err != nil || len(states) != 0 {
				t.Errorf("the rebuilds in progress after the end: %+v, %v; want none", states, err)
			}
			if wipes := s.wipes(); (wipes > 0) != c.wiped {
				t.Errorf("%d wipes; want the whole store wiped: %v", wipes, c.wiped)
			}
		})
	}
}
