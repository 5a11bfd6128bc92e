package stacktest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

// seen is a projection that records the versions it was given.
type seen struct {
	mu       sync.Mutex
	versions map[string]int64
}

func (s *seen) Apply(_ context.Context, events []*contract.Event) []projector.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range events {
		s.versions[e.Key] = max(s.versions[e.Key], e.Version)
	}
	return make([]projector.Result, len(events)) // all Applied
}

func (s *seen) version(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[key]
}

// A document written through the writer's API goes through the relay to
// a projector over the test's store: the three services of a Stack,
// started as their binaries start them, make the pipeline.
func TestPipeline(t *testing.T) {
	st := stacktest.New(t, pg)
	api, _ := stacktest.StartWriter(t, writer.ServiceConfig{PostgresURL: st.PostgresURL})
	r, _ := stacktest.StartRelay(t, relay.ServiceConfig{NATSURL: st.NATS.URL, Relay: relay.Config{PostgresURL: st.PostgresURL}})
	if !r.Active() {
		t.Fatal("StartRelay returned a relay that does not hold its slot")
	}
	store := &seen{versions: map[string]int64{}}
	stacktest.StartProjector(t, projector.ServiceConfig{NATSURL: st.NATS.URL, Runtime: projector.Config{Name: "seen"}}, store, nil)

	req, err := http.NewRequest(http.MethodPut, api+"/v1/documents/a", strings.NewReader(`{"version":3,"body":"a body"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT a document: %s", resp.Status)
	}
	testenv.Eventually(t, "the projector to see version 3 of a", 20*time.Second, func() bool { return store.version("a") == 3 })
}

// With NATS users, the writer (its API and its ingest consumer), the relay
// and a projector each run as their own user, and a producer publishes to
// the writer's queue as its own: the pipeline works end to end, every
// connection is its service's user, the server refused none of them
// anything, and a client without credentials is refused.
func TestPipelineWithNATSUsers(t *testing.T) {
	st := stacktest.New(t, pg, stacktest.WithNATSUsers())
	addrs := map[string]string{}
	for _, name := range []string{"writer", "relay", "index"} {
		a, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[name] = a
	}
	api, _ := st.StartWriter(t, writer.ServiceConfig{NATSURL: st.NATS.URL, MetricsAddr: addrs["writer"]})
	st.StartRelay(t, relay.ServiceConfig{MetricsAddr: addrs["relay"]})
	store := &seen{versions: map[string]int64{}}
	st.StartProjector(t, projector.ServiceConfig{MetricsAddr: addrs["index"], Runtime: projector.Config{Name: "index"}}, store, nil)

	req, err := http.NewRequest(http.MethodPut, api+"/v1/documents/a", strings.NewReader(`{"version":3,"body":"a body"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT a document: %s", resp.Status)
	}

	// A producer's document, through the writer's ingest consumer (the
	// publish is answered once the writer has made its stream).
	opts, err := st.NATSAuth(t, natsauth.UserProducer).Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(st.NATS.URL, append(opts, nats.Name("a producer"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the producer's publish to be acknowledged", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := pjs.Publish(ctx, contract.IngestSubject("b"), []byte(`{"key":"b","version":2,"body":"b body"}`))
		return err == nil
	})
	testenv.Eventually(t, "the projector to see a at 3 and b at 2", 20*time.Second, func() bool {
		return store.version("a") == 3 && store.version("b") == 2
	})

	want := map[string]string{"converge-writer": natsauth.UserWriter, "converge-relay": natsauth.UserRelay,
		"converge-projector-index": natsauth.UserIndex}
	cz, err := st.NATS.Server.Server.Connz(&server.ConnzOptions{Username: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range cz.Conns {
		if c.Name == t.Name() || c.Name == "a producer" {
			continue // the test's own connections
		}
		got[c.Name] = c.AuthorizedUser
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("connections %v, want %v", got, want)
	}
	for name, addr := range addrs {
		m, err := telemetry.Scrape(context.Background(), "http://"+addr+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if n := m.Sum("converge_nats_permission_violations_total", nil); n != 0 {
			t.Errorf("%s: %v NATS permission violations", name, n)
		}
	}
	if nc, err := nats.Connect(st.NATS.URL); err == nil {
		nc.Close()
		t.Error("a client without credentials was admitted")
	}
}

// config is a service's configuration that dials nothing.
type config struct{ invalid bool }

func (c config) Validate() error {
	if c.invalid {
		return errors.New("invalid")
	}
	return nil
}

func (config) Connections() service.Conns { return service.Conns{} }

// Stop ends a service's context and returns its Run's error; a service
// stopped by the test is not reported again at its end.
func TestStopReturnsRunsError(t *testing.T) {
	failed := errors.New("failed")
	svc := stacktest.Start(t, config{}, func(ctx context.Context, _ config, _ service.Deps) error {
		<-ctx.Done()
		return failed
	})
	// Run returns once its context ends, and what failed on the way out
	// is a failure: Stop returns it.
	if err := svc.Stop(); !errors.Is(err, failed) {
		t.Fatalf("stopped: %v, want %v", err, failed)
	}
	svc = stacktest.Start(t, config{}, func(ctx context.Context, _ config, _ service.Deps) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if err := svc.Stop(); err != nil {
		t.Fatalf("a clean stop: %v", err)
	}
	svc = stacktest.Start(t, config{invalid: true}, func(context.Context, config, service.Deps) error { return nil })
	<-svc.Done()
	if err := svc.Stop(); err == nil || err.Error() != "invalid" {
		t.Fatalf("an invalid configuration: %v", err)
	}
	if err := svc.Stop(); err == nil {
		t.Fatal("a second Stop lost Run's error")
	}
}
