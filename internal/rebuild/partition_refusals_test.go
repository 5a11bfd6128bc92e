package rebuild_test

import (
	"context"
	"encoding/json"
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
	if len(s.wrote) != 0 {
		t.Errorf("the refusals wrote %d times to the store", len(s.wrote))
	}
}

// A rebuild of one partition left by a process, begun with another
// number of partitions than the partitioned stream has now (made anew
// since, whose consumers fill every document again), is abandoned
// without a wipe, saying why, so that the next rebuild can run; on an
// instance configured otherwise than the stream, it waits for one
// configured as the stream is. One resumed on an index that now refuses
// writes is abandoned too: a whole rebuild is what replaces that index.
func TestPartitionRebuildOfAnotherNumberOfPartitions(t *testing.T) {
	for _, c := range []struct {
		name                   string
		began, stream, running int
		refusing               bool
		abandoned              string // what the status says; "": not abandoned
	}{
		{"partitions made anew", 4, 2, 2, false, "now has 2 partitions, not 4"},
		{"instance configured otherwise", 2, 2, 4, false, ""},
		{"index refusing writes", 2, 2, 2, true, "another embedder's: rebuild the whole store"},
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
			left, err := json.Marshal(rebuild.State{ID: "left", Phase: rebuild.PhaseWiping, InPlace: true, Target: "gen-0", Previous: "gen-0",
				Partition: &part, Partitions: c.began, StartedAt: time.Now().UTC()})
			if err != nil {
				t.Fatal(err)
			}
			kv, err := js.KeyValue(context.Background(), rebuild.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(context.Background(), "index", left); err != nil {
				t.Fatal(err)
			}
			p, _ := serveRebuilds(t, js, stores, c.running)
			if c.abandoned != "" {
				testenv.Eventually(t, "the rebuild to be abandoned", 10*time.Second, func() bool {
					st := p.Manager.Status(context.Background())
					return st.Phase == rebuild.PhaseDone && st.ID == "left"
				})
				st := p.Manager.Status(context.Background())
				if !strings.Contains(st.Abandoned, c.abandoned) {
					t.Errorf("abandoned: %q; want it to say %q", st.Abandoned, c.abandoned)
				}
				if _, err := kv.Get(context.Background(), "index"); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Errorf("the abandoned rebuild's state: %v; want it gone", err)
				}
			} else {
				testenv.Eventually(t, "the rebuild to wait for an instance configured as the stream", 10*time.Second, func() bool {
					st := p.Manager.Status(context.Background())
					return st.Phase == rebuild.PhaseRetrying && strings.Contains(st.Error, "run it with 2")
				})
				if _, err := kv.Get(context.Background(), "index"); err != nil {
					t.Errorf("the rebuild's state: %v; want it kept", err)
				}
			}
			s.mu.Lock()
			wrote := len(s.wrote)
			s.mu.Unlock()
			if wrote != 0 {
				t.Errorf("%d writes to the store; want none (no wipe)", wrote)
			}
		})
	}
}
