package netfault_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/netfault"
)

// echo is a TCP echo server on 127.0.0.1 that records when it received
// each byte.
type echo struct {
	ln       net.Listener
	wg       sync.WaitGroup
	accepted atomic.Int64
	ended    atomic.Int64 // connections whose client side ended (EOF or error)

	mu    sync.Mutex
	conns []net.Conn
	got   []received
}

type received struct {
	at   time.Time
	data string
}

func startEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Go(func() { e.serve(c) })
		}
	})
	t.Cleanup(e.close)
	return e
}

func (e *echo) serve(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			e.mu.Lock()
			e.got = append(e.got, received{at: time.Now(), data: string(buf[:n])})
			e.mu.Unlock()
			if _, werr := c.Write(buf[:n]); werr != nil {
				e.ended.Add(1)
				return
			}
		}
		if err != nil {
			e.ended.Add(1)
			return
		}
	}
}

// firstAt is when the server first received a byte of s.
func (e *echo) firstAt(s string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.got {
		if strings.Contains(r.data, s) {
			return r.at
		}
	}
	return time.Time{}
}

func (e *echo) close() {
	_ = e.ln.Close()
	e.mu.Lock()
	for _, c := range e.conns {
		_ = c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// noLeaks fails t if, once every cleanup registered after it has run,
// goroutines started during the test are still running.
func noLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines before the test, %d after it:\n%s", before, runtime.NumGoroutine(), buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func startProxy(t *testing.T, cfg netfault.Config) *netfault.Proxy {
	t.Helper()
	p, err := netfault.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads it back within timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echoed " + string(buf) + ", want " + msg)
	}
	return nil
}

// ended waits until reading c fails (the proxy closed it) and returns the
// error; it fails t if c is still open after timeout.
func ended(t *testing.T, c net.Conn, timeout time.Duration) error {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection is still open after %v (read: %v)", timeout, err)
	}
	return err
}

// dialReset connects to addr and returns how the connection ended: the
// reset of a proxy that accepts and resets may come before the connect
// returns, or after.
func dialReset(t *testing.T, addr string) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return ended(t, c, 2*time.Second)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  netfault.Config
		ok   bool
	}{
		{"target", netfault.Config{Target: "127.0.0.1:1"}, true},
		{"reset", netfault.Config{Target: "127.0.0.1:1", CutMode: netfault.Reset}, true},
		{"no target", netfault.Config{}, false},
		{"no port", netfault.Config{Target: "127.0.0.1"}, false},
		{"unknown mode", netfault.Config{Target: "127.0.0.1:1", CutMode: 7}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func TestForwardsBothWaysAndPassesHalfClose(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	var mu sync.Mutex
	tapped := map[netfault.Direction]*bytes.Buffer{netfault.ToTarget: {}, netfault.ToClient: {}}
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String(), Tap: func(s netfault.Segment) {
		mu.Lock()
		defer mu.Unlock()
		if s.Conn != 1 {
			t.Errorf("segment of connection %d, want 1", s.Conn)
		}
		tapped[s.Dir].Write(s.Data)
	}})
	c := dial(t, p.Addr())
	msg := strings.Repeat("converge ", 10000) // several segments
	if err := roundTrip(c, msg, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The client's end reaches the server, whose end reaches the client.
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := ended(t, c, 5*time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("after a half-close the client reads %v, want EOF", err)
	}
	eventually(t, "the link to close", func() bool { return p.Stats().Live == 0 })
	mu.Lock()
	defer mu.Unlock()
	if tapped[netfault.ToTarget].String() != msg || tapped[netfault.ToClient].String() != msg {
		t.Errorf("the tap saw %d bytes to the target and %d to the client, want %d each",
			tapped[netfault.ToTarget].Len(), tapped[netfault.ToClient].Len(), len(msg))
	}
	st := p.Stats()
	if st.Accepted != 1 || st.Linked != 1 || st.ToTarget != int64(len(msg)) || st.ToClient != int64(len(msg)) {
		t.Errorf("stats %+v", st)
	}
}

func TestCutClosesEveryConnectionAndBlackHolesNewOnes(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String()})
	live := []*net.TCPConn{dial(t, p.Addr()), dial(t, p.Addr())}
	for _, c := range live {
		if err := roundTrip(c, "before", 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Cut()
	for _, c := range live {
		ended(t, c, 2*time.Second)
	}
	// The server's side of each ends too: both ends stay up, the link
	// between them is gone.
	eventually(t, "the server to see both connections end", func() bool { return e.ended.Load() == 2 })

	// A connection made during the cut is accepted and held, but nothing
	// reaches the server: it never gets a connection.
	held := dial(t, p.Addr())
	if _, err := held.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cut to hold the new connection", func() bool { return p.Stats().Held == 1 })
	if st := p.Stats(); st.Linked != 2 || e.accepted.Load() != 2 {
		t.Fatalf("during the cut: stats %+v, the server accepted %d connections; want 2 linked, 2 accepted", st, e.accepted.Load())
	}

	p.Heal()
	// Closed: with a FIN, or an RST since the proxy never read what the
	// client sent.
	if err := ended(t, held, 2*time.Second); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a held connection at Heal reads %v, want its end", err)
	}
	if !e.firstAt("lost").IsZero() {
		t.Error("bytes sent on a held connection reached the server")
	}
	after := dial(t, p.Addr())
	if err := roundTrip(after, "after", 2*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	if st := p.Stats(); st.Accepted != 4 || st.Linked != 3 || st.Held != 0 || st.Live != 1 {
		t.Errorf("stats after Heal %+v", st)
	}
}

func TestCutWithResetResetsConnections(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String(), CutMode: netfault.Reset})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if err := ended(t, c, 2*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a live connection at the cut reads %v, want a reset", err)
	}
	if err := dialReset(t, p.Addr()); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection during the cut gets %v, want a reset", err)
	}
	if st := p.Stats(); st.Reset != 1 || st.Held != 0 {
		t.Errorf("stats %+v, want 1 reset, none held", st)
	}
	p.Heal()
	if err := roundTrip(dial(t, p.Addr()), "after", 2*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}

func TestPauseKeepsTheConnectionAndForwardsOnlyAfterResume(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String()})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Pause()
	if _, err := c.Write([]byte("frozen")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the bytes wait in the proxy
	resumed := time.Now()
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, len("frozen"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "frozen" {
		t.Fatalf("after Resume: %q, %v", buf, err)
	}
	if at := e.firstAt("frozen"); at.Before(resumed) {
		t.Errorf("the server got bytes sent during the pause %v before Resume", resumed.Sub(at))
	}
	if st := p.Stats(); st.Live != 1 || st.Linked != 1 {
		t.Errorf("the pause changed the connections: %+v", st)
	}
}

func TestPauseOneWayLetsRequestsInAndHoldsAnswers(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String()})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.PauseOneWay(netfault.ToClient)
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	answered := make(chan time.Time, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, len("request"))
		_, err := io.ReadFull(c, buf)
		if err != nil || string(buf) != "request" {
			t.Errorf("the answer: %q, %v", buf, err)
		}
		answered <- time.Now()
	}()
	// The request reaches the server while its answer waits.
	eventually(t, "the request to reach the server", func() bool { return !e.firstAt("request").IsZero() })
	time.Sleep(100 * time.Millisecond)
	resumed := time.Now()
	p.Resume()
	if at := <-answered; at.Before(resumed) {
		t.Errorf("the answer came %v before Resume", resumed.Sub(at))
	}
}

func TestLatencyDelaysEachDirection(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	p := startProxy(t, netfault.Config{Target: e.ln.Addr().String()})
	c := dial(t, p.Addr())
	const d = 100 * time.Millisecond
	p.Latency(d)
	sent := time.Now()
	if err := roundTrip(c, "slow", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(sent)
	if oneWay := e.firstAt("slow").Sub(sent); oneWay < d {
		t.Errorf("one way took %v, want at least %v", oneWay, d)
	}
	if rtt < 2*d {
		t.Errorf("a round trip took %v, want at least %v", rtt, 2*d)
	}
	p.Latency(0)
	sent = time.Now()
	if err := roundTrip(c, "fast", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(sent); rtt >= d {
		t.Errorf("without latency a round trip took %v", rtt)
	}
}

func TestDialFailureResetsTheClient(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	p := startProxy(t, netfault.Config{Target: target})
	if err := dialReset(t, p.Addr()); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("with the target down the client gets %v, want a reset", err)
	}
}

// TestFaultsConcurrentWithTraffic runs clients through the proxy while
// other goroutines cut, heal, pause, resume and change the latency at
// random (under -race, the proxy's state and every link's); then, healed
// and resumed, every new connection works, and Close leaves no goroutine.
func TestFaultsConcurrentWithTraffic(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	for _, mode := range []netfault.CutMode{netfault.BlackHole, netfault.Reset} {
		t.Run(mode.String(), func(t *testing.T) {
			var tapped atomic.Int64
			p := startProxy(t, netfault.Config{Target: e.ln.Addr().String(), CutMode: mode,
				Tap: func(s netfault.Segment) { tapped.Add(int64(len(s.Data))) }})
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
						if err != nil {
							continue
						}
						for j := 0; j < 20 && roundTrip(c, strings.Repeat("x", 1+i*j*50), 200*time.Millisecond) == nil; j++ {
						}
						_ = c.Close()
					}
				})
			}
			rng := rand.New(rand.NewPCG(1, uint64(mode)))
			faults := []func(){p.Cut, p.Heal, p.Pause, p.Resume, func() { p.PauseOneWay(netfault.Direction(1 + rng.IntN(2))) },
				func() { p.Latency(time.Duration(rng.IntN(20)) * time.Millisecond) }, func() { _ = p.Stats() }}
			for range 300 {
				faults[rng.IntN(len(faults))]()
				time.Sleep(time.Millisecond)
			}
			close(stop)
			p.Heal()
			p.Resume()
			p.Latency(0)
			wg.Wait()
			if err := roundTrip(dial(t, p.Addr()), "healed", 2*time.Second); err != nil {
				t.Fatalf("after the faults: %v", err)
			}
			if tapped.Load() == 0 {
				t.Error("no byte went through")
			}
		})
	}
}

func TestCloseEndsEverything(t *testing.T) {
	noLeaks(t)
	e := startEcho(t)
	// A live link whose bytes wait in a pause, and a connection held by a
	// cut, on two proxies.
	frozen, err := netfault.Start(netfault.Config{Target: e.ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	linked := dial(t, frozen.Addr())
	if err := roundTrip(linked, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	frozen.Pause()
	if _, err := linked.Write([]byte("waiting")); err != nil {
		t.Fatal(err)
	}
	cut, err := netfault.Start(netfault.Config{Target: e.ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	cut.Cut()
	held := dial(t, cut.Addr())
	eventually(t, "a held connection", func() bool { return cut.Stats().Held == 1 })

	for _, p := range []*netfault.Proxy{frozen, cut} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
			t.Error("a proxy still accepts connections after Close")
		}
		if err := p.Close(); err != nil {
			t.Errorf("a second Close: %v", err)
		}
	}
	ended(t, linked, 2*time.Second)
	ended(t, held, 2*time.Second)
}
