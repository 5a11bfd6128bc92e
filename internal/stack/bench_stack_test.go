// The pipeline the end-to-end benchmarks run (in this process, or the
// services a process each), and their clients of it: writes, the
// stream's position, the projectors caught up, verify.

package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// benchStack is the dev pipeline plus the clients the benchmarks use.
type benchStack struct {
	layout string // "one process" or "a process each"
	dev    *stack.Stack
	pool   *pgxpool.Pool
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	client *http.Client
	// services are the writer, relay and projector processes of the
	// deployed layout; none when the pipeline runs in this process.
	services []*proc.Child
}

func startBenchStack(b *testing.B, processes bool) (*benchStack, string) {
	b.Helper()
	ctx := context.Background()
	cfg := stack.Config{Log: config.NewLogger(os.Stderr, "warn"), LogOut: os.Stderr,
		Index: &indexprojector.Config{}, Graph: &graphprojector.Config{}, InfraOnly: processes}
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr} {
		addr, err := stack.FreeAddr()
		if err != nil {
			b.Fatal(err)
		}
		*a = addr
	}
	var bin *testenv.Binaries
	if processes {
		bin = testenv.BuildBinaries(b)
	}
	began := time.Now()
	dev, err := stack.Start(ctx, cfg)
	if err != nil {
		b.Fatalf("start the pipeline: %v", err)
	}
	s := &benchStack{layout: "one process", dev: dev, client: &http.Client{Timeout: time.Minute,
		Transport: &http.Transport{MaxIdleConns: 2 * latencyWorkers, MaxIdleConnsPerHost: 2 * latencyWorkers}}}
	if processes {
		s.layout = "a process each"
		if err := s.startServices(ctx, bin); err != nil {
			s.close(b)
			b.Fatalf("start the services: %v", err)
		}
	}
	if s.pool, err = pgxpool.New(ctx, dev.ReaderURL); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	natsOpts, err := dev.OperatorNATS.Options()
	if err != nil {
		s.close(b)
		b.Fatal(err)
	}
	if s.nc, err = nats.Connect(dev.NATSURL, natsOpts...); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		s.close(b)
		b.Fatal(err)
	}
	// The relay creates the stream when it starts.
	if s.stream, err = s.js.Stream(ctx, contract.DocsStream); err != nil {
		s.close(b)
		b.Fatalf("stream CONVERGE_DOCS: %v", err)
	}
	return s, fmt.Sprintf("pipeline ready in %v: PostgreSQL 15 (throwaway, fsync off), embedded NATS (in the benchmark's process), writer, relay, embedded index and graph projectors, %s; on %d CPUs",
		time.Since(began).Round(time.Millisecond), s.layout, runtime.NumCPU())
}

// benchServices are the processes of the deployed layout, in the order
// startServices starts them.
var benchServices = []string{"writer", "relay", "projector-index", "projector-graph"}

func (s *benchStack) startServices(ctx context.Context, bin *testenv.Binaries) error {
	cfg := s.dev.Config
	natsURL, data, tokens := s.dev.NATSURL, cfg.DataDir, s.dev.TokensFile
	// Each service runs as its own Postgres role and NATS user, as
	// deployed; passwords travel in the environment, never in argv.
	for _, svc := range []struct {
		name, user string
		args       []string
	}{
		{"writer", natsauth.UserWriter, []string{"-postgres-url", s.dev.WriterURL, "-http-addr", cfg.HTTPAddr, "-metrics-addr", cfg.WriterAddr, "-tokens-file", tokens}},
		{"relay", natsauth.UserRelay, []string{"-postgres-url", s.dev.RelayURL, "-nats-url", natsURL, "-metrics-addr", cfg.RelayAddr}},
		{"projector-index", natsauth.UserIndex, []string{"-nats-url", natsURL, "-data-dir", data, "-metrics-addr", cfg.IndexAddr, "-tokens-file", tokens}},
		{"projector-graph", natsauth.UserGraph, []string{"-nats-url", natsURL, "-data-dir", data, "-metrics-addr", cfg.GraphAddr, "-tokens-file", tokens}},
	} {
		args := append(svc.args, "-log-level", "warn")
		opts := proc.Options{Out: os.Stderr, Unset: []string{config.EnvPostgresURL, natsauth.EnvUser, natsauth.EnvPassword}}
		if na := s.dev.NATSAuth(svc.user); na.User != "" && svc.name != "writer" {
			args = append(args, "-nats-user", na.User)
			opts.Env = append(opts.Env, natsauth.EnvPassword+"="+na.Password)
		}
		c, err := proc.Start(bin.Path(svc.name), args, opts)
		if err != nil {
			return fmt.Errorf("start %s: %w", svc.name, err)
		}
		s.services = append(s.services, c)
	}
	relayActive := func() bool {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		m, err := telemetry.Scrape(sctx, "http://"+cfg.RelayAddr+"/metrics")
		if err != nil {
			return false
		}
		active, err := m.Value("converge_relay_active", nil)
		return err == nil && active == 1
	}
	for _, w := range []struct {
		what  string
		ready func() bool
	}{
		{"the writer", func() bool { return stack.HTTPOK("http://" + cfg.WriterAddr + "/readyz") }},
		{"the relay to hold its slot", relayActive},
		{"the index projector", func() bool { return stack.HTTPOK("http://" + cfg.IndexAddr + "/readyz") }},
		{"the graph projector", func() bool { return stack.HTTPOK("http://" + cfg.GraphAddr + "/readyz") }},
	} {
		// A service that exits while starting ends the wait at once.
		err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { _, c := s.exited(); return c != nil || w.ready() })
		if name, c := s.exited(); c != nil {
			return fmt.Errorf("%s exited while starting: %w", name, c.Err())
		}
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", w.what, err)
		}
	}
	s.dev.APIURL = "http://" + cfg.HTTPAddr
	return nil
}

// exited returns a service process that has exited and its name, or nil.
func (s *benchStack) exited() (string, *proc.Child) {
	for i, c := range s.services {
		if c.Exited() {
			return benchServices[i], c
		}
	}
	return "", nil
}

func (s *benchStack) close(b *testing.B) {
	for _, c := range s.services {
		_ = c.Stop(30 * time.Second)
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if err := s.dev.Stop(); err != nil {
		b.Errorf("stop the pipeline: %v", err)
	}
}

// postBatch posts one NDJSON batch and returns how many lines were applied.
func (s *benchStack) postBatch(ctx context.Context, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.dev.APIURL+"/v1/documents:batch", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	auth.SetBearer(req.Header, s.dev.WriterToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("writer: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("writer: %s", resp.Status)
	}
	applied := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line struct {
			Result string          `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return applied, fmt.Errorf("writer: unreadable result line %q", sc.Text())
		}
		if line.Result != "applied" {
			return applied, fmt.Errorf("writer: result %q %s", line.Result, line.Error)
		}
		applied++
	}
	return applied, sc.Err()
}

func (s *benchStack) put(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	auth.SetBearer(req.Header, s.dev.WriterToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	defer resp.Body.Close()
	var r struct {
		Result string `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Result != "applied" {
		return fmt.Errorf("writer: PUT %s: %s, result %q, %w", u, resp.Status, r.Result, err)
	}
	return nil
}

func (s *benchStack) lastSeq(ctx context.Context, b *testing.B) uint64 {
	b.Helper()
	info, err := s.stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return info.State.LastSeq
}

// waitCaughtUp polls until the stream holds every event up to seq and both
// projectors' consumers have been delivered it, with nothing pending and
// nothing unacknowledged: the projector acknowledges only after its store
// write.
func (s *benchStack) waitCaughtUp(ctx context.Context, b *testing.B, seq uint64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for _, name := range []string{"index", "graph"} {
		for {
			c, err := s.js.Consumer(ctx, contract.DocsStream, name)
			if err == nil {
				info, err := c.Info(ctx)
				if err == nil && info.Delivered.Stream >= seq && info.NumPending == 0 && info.NumAckPending == 0 {
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("the %s projector did not reach stream sequence %d within 5 minutes", name, seq)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// mustAgree compares both projections with Postgres (verify.Compare of
// the bucket digests, the projectors answering over HTTP).
func (s *benchStack) mustAgree(ctx context.Context, b *testing.B) {
	b.Helper()
	truth := &postgres.Postgres{Pool: s.pool}
	for _, side := range bothSides(s.dev.IndexAddr, s.dev.GraphAddr, s.dev.OperatorToken) {
		rep, err := verify.Compare(ctx, truth, side.Side, side.Kind, verify.DefaultBuckets, nil)
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Agrees {
			b.Fatalf("verify: %s disagrees with Postgres on %d documents once caught up (first: %+v)", rep.Store, len(rep.Differences), rep.Differences[0])
		}
	}
}

// bothSides are the index and the graph, asked of their projectors at
// these addresses with token.
func bothSides(indexAddr, graphAddr, token string) []verify.Projection {
	return []verify.Projection{
		{Kind: verify.Index, Side: &verify.Remote{Label: "index", Addr: indexAddr, Token: token}},
		{Kind: verify.Graph, Side: &verify.Remote{Label: "graph", Addr: graphAddr, Token: token}},
	}
}
