package writer_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/stack/stacktest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The service reports not-ready until the schema is current, migrates when
// asked, serves the API, and on shutdown lets in-flight requests finish.
func TestServiceReadinessAndGracefulShutdown(t *testing.T) {
	dbURL := pg.NewDatabase(t) // empty: not migrated
	metricsAddr := freeAddr(t)

	// The writer as its binary runs it: service.Run over writer.Run.
	run := func(migrate bool) (string, *stacktest.Service) {
		return stacktest.StartWriter(t, writer.ServiceConfig{
			PostgresURL: dbURL, HTTPAddr: "127.0.0.1:0", MetricsAddr: metricsAddr, Migrate: migrate,
			MaxConns: 4, ShutdownGrace: 10 * time.Second,
		})
	}

	_, w := run(false)
	testenv.Eventually(t, "readyz to answer", waitTimeout, func() bool { c, _ := get(t, "http://"+metricsAddr+"/readyz"); return c != 0 })
	if code, body := get(t, "http://"+metricsAddr+"/readyz"); code != 503 || !strings.Contains(body, "converge migrate up") {
		t.Fatalf("readyz on an unmigrated database: %d %s", code, body)
	}
	if code, _ := get(t, "http://"+metricsAddr+"/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	base, w := run(true)
	testenv.Eventually(t, "ready", waitTimeout, func() bool { c, _ := get(t, "http://"+metricsAddr+"/readyz"); return c == 200 })

	// Start requests whose bodies are only half sent, shut down while they
	// are in flight, then finish sending: every one must complete. Each
	// asks for 100 Continue, which the server sends once its handler reads
	// the body: then the request is surely accepted.
	const inflight = 20
	var wg sync.WaitGroup
	codes := make(chan int, inflight)
	continued := make(chan struct{}, inflight)
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	t.Cleanup(client.CloseIdleConnections)
	writers := make([]*io.PipeWriter, inflight)
	rests := make([]string, inflight)
	for i := range inflight {
		body := fmt.Sprintf(`{"version":1,"body":%q}`, strings.Repeat("paragraph\n\n", 2000))
		pr, pw := io.Pipe()
		writers[i], rests[i] = pw, body[len(body)/2:]
		wg.Add(1)
		go func() {
			defer wg.Done()
			trace := &httptrace.ClientTrace{Got100Continue: func() { continued <- struct{}{} }}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
				"PUT", fmt.Sprintf("%s/v1/documents/s%d", base, i), pr)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Expect", "100-continue")
			req.ContentLength = int64(len(body))
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
		go func() { _, _ = io.WriteString(pw, body[:len(body)/2]) }()
	}
	for i := range inflight {
		select {
		case <-continued:
		case <-time.After(waitTimeout):
			t.Fatalf("%d of %d requests reached their handler within %v", i, inflight, waitTimeout)
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop() }()
	// Shutdown begins by closing the listener.
	testenv.Eventually(t, "the API to refuse connections once shutdown began", waitTimeout, func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
	for i, pw := range writers {
		_, _ = io.WriteString(pw, rests[i])
		_ = pw.Close()
	}
	wg.Wait()
	close(codes)
	if err := <-stopped; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	ok := 0
	for c := range codes {
		if c != 200 {
			t.Fatalf("in-flight request answered %d across shutdown", c)
		}
		ok++
	}
	var stored int
	if err := pgxCount(dbURL, &stored); err != nil {
		t.Fatal(err)
	}
	if stored != inflight || ok != inflight {
		t.Fatalf("%d requests answered 200, %d documents stored, want %d", ok, stored, inflight)
	}
	t.Logf("%d of %d requests completed across shutdown", ok, inflight)
}
